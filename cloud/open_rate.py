"""Opens per identity: a token bucket, so one client cannot make the verifier prefill without end.

Every new session (a Decode's Open, a Generate) costs a prefill of its whole prompt before it is
anything else. The session table bounds how many a client holds at once, not how often it opens
and drops them; this bounds the rate: ``burst`` Opens at once, then ``per_s`` a second. Resumes and
a conversation's next turn are not Opens. Event-loop only; the clock is injectable.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["OpenRate"]


class OpenRate:
    """A bucket of ``burst`` Opens per identity, refilled at ``per_s`` (``per_s`` 0: no bound)."""

    def __init__(self, per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_s, self.burst = per_s, burst
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # identity -> (Opens left, when counted)

    def take(self, identity: str) -> bool:
        """Count an Open of ``identity``; False (not counted) when its bucket is empty."""
        if not self.per_s:
            return True
        now = self._clock()
        left, then = self._buckets.get(identity, (float(self.burst), now))
        left = min(float(self.burst), left + (now - then) * self.per_s)
        if left < 1.0:
            self._buckets[identity] = (left, now)
            return False
        self._buckets[identity] = (left - 1.0, now)
        if len(self._buckets) > 4096:  # forget full buckets (they hold nothing a new one would not)
            self._buckets = {k: v for k, v in self._buckets.items()
                             if v[0] + (now - v[1]) * self.per_s < self.burst}
        return True

    def refusal(self) -> str:
        return (f"this client opens sessions faster than this verifier allows ({self.burst} at once, then "
                f"{self.per_s:g} a second); keep a session across turns, or retry later")
