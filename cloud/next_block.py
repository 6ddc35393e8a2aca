"""When a stream's next usable block is expected after a correction: the stale-decode deadline.

After a correction the edge drafts the next chain and sends it; until its
first block arrives, the cloud answers the stale blocks in flight with tokens it
decodes alone (stale decodes). A forward cannot be stopped once started, so a stale decode that would
still run when that block arrives delays it. ``NextBlockClock`` measures, per
stream, the gap from a correction's verdict leaving to the first block of the
new epoch arriving (a moving average), and gives the deadline that
``decodes_stale`` weighs a stale decode against; ``stale_decode_overrun_pays``
says when a stale decode may run past it. The verifier
(``VerifierSession.verify_chain_steps``) and the performance model
(``sim.perf.verifier_sim``) both decide by these. Times are seconds on the
caller's clock; nothing here reads one.
"""

from __future__ import annotations

from shared.stats import Ewma

__all__ = ["NextBlockClock", "decodes_stale", "stale_decode_overrun_pays"]


class NextBlockClock:
    """The gap from a correction's verdict to the edge's next block, and the deadline it sets."""

    def __init__(self) -> None:
        self.gap_s = Ewma()
        self._corrected_at: float | None = None  # the last correction's verdict left; None once the next block came
        self._epoch = 0  # the session's epoch after that correction

    def corrected(self, now: float, epoch: int) -> None:
        """A correction's verdict left at ``now``; the session is at ``epoch`` since."""
        self._corrected_at, self._epoch = now, epoch

    def arrived(self, now: float, epoch: int) -> None:
        """A block of ``epoch`` arrived at ``now``: the first of the new epoch (or a later one: the
        verifier refuses those, the model's chains may skip) is one gap sample."""
        if self._corrected_at is not None and epoch >= self._epoch:
            self.gap_s.add(max(now - self._corrected_at, 0.0))
            self._corrected_at = None

    def deadline(self) -> float | None:
        """When the next block is expected: None once it came, or before any gap was measured."""
        if self._corrected_at is None or self.gap_s.value is None:
            return None
        return self._corrected_at + self.gap_s.value


def stale_decode_overrun_pays(overrun_s: float, ahead_s: float, guess_odds: float) -> bool:
    """Whether a stale block's forward that would still run ``overrun_s`` after the edge's next block is
    due (``ahead_s`` from now) is worth starting, in greedy and coupled modes. The token it decodes is
    the one that verifying the next block's first draft (the edge's guess of it) would commit, so
    the stale decode changes when the edge learns it, not what: when the guess holds (``guess_odds``) the
    block waits ``overrun_s`` for the forward; when it does not, the edge hears of it ``ahead_s`` or
    more earlier than from that block's verdict, and drafts the right chain sooner. (In rejection
    mode the token is sampled apart from the guess, which then seldom holds: a stale decode there must not
    overrun.)"""
    return (1.0 - guess_odds) * max(ahead_s, 0.0) > guess_odds * overrun_s


def decodes_stale(*, enabled: bool, usable_behind: bool, now: float, forward_s: float, deadline: float | None,
                  may_overrun: bool, guess_odds: float) -> bool:
    """Whether the stale block at the front of a session's pending blocks gets the next token decoded
    for it: the service decodes for stale blocks (``enabled``), no usable block waits behind it, and
    the forward (``forward_s`` from ``now``) would be over by ``deadline`` (None: no deadline, or no
    forward needed), or, where it ``may_overrun`` (greedy and coupled modes), its overrun pays
    (``stale_decode_overrun_pays`` at ``guess_odds``)."""
    if not enabled or usable_behind:
        return False
    if deadline is None:
        return True
    overrun = now + forward_s - deadline
    return overrun <= 0 or (may_overrun and stale_decode_overrun_pays(overrun, deadline - now, guess_odds))
