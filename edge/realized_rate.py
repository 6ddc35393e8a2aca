"""How fast the controller's choices turned out against what it predicted for them (``edge.controller``).

The controller weighs drafting against the cloud alone on a model of each (``shared.acceptance`` through
``Controller.predict_drafting``, and ``Controller.predict_cloud``). The model leaves things out (a chain's
restart after a correction on a long trip, the edge's own bookkeeping, a drafter's cost that varies with
the context), and what it leaves out does not weigh alike on both sides: measured, a weak drafter's chains
on acespec-50k made 8.0 tok/s where the model said 9.4-10.4, while the cloud alone made 12.0 where it said
10.9, so a drafter 25% slower than the cloud alone stayed chosen for a third of the session. Here each
side's predictions are held to what they delivered: the ratio of the seconds its predictions gave the
tokens committed under it to the seconds those tokens took.
"""

from __future__ import annotations

import math

__all__ = ["RealizedRates"]


class RealizedRates:
    """Per side (drafting, the cloud alone), predicted over taken seconds of what was committed under it.

    ``begin`` opens an interval where the controller chose (its side, its predicted tokens/s, the tokens
    the limit left, the time); ``end`` at the next choice closes it and counts it: the tokens committed
    in it at the predicted rate, against the seconds it took. An interval that began with a swap is not
    counted (it pays the drained pipeline, which ``Controller.swap_pays`` already prices). Every interval's
    seconds fade both sides' counts (``memory_s``), and each side's ratio is taken over ``prior_s`` seconds
    at a ratio of 1 besides its counts: one short chain moves it little, and a side not chosen for a while
    (a drafter handed to the cloud) returns to its bare predictions, to be measured again.
    """

    def __init__(self, prior_s: float = 1.0, memory_s: float = 10.0) -> None:
        if prior_s <= 0 or memory_s <= 0:
            raise ValueError("prior_s and memory_s must be > 0")
        self.prior_s, self.memory_s = prior_s, memory_s
        self.sums = {side: [0.0, 0.0] for side in (True, False)}  # drafting? -> [predicted s, taken s]
        self._open: tuple[bool, float | None, int | None, float] | None = None  # (side, tok/s, tokens left, began)

    def ratio(self, drafting: bool) -> float:
        """What that side delivered against its predictions: scale them by this (1.0 before any interval)."""
        predicted, taken = self.sums[drafting]
        return (self.prior_s + predicted) / (self.prior_s + taken)

    def end(self, tokens_left: int | None, now: float | None) -> None:
        """Close the open interval at ``now`` with ``tokens_left`` left (None for either: not measured)."""
        opened, self._open = self._open, None
        if opened is None or now is None:
            return
        drafting, rate, left, began = opened
        seconds = now - began
        if seconds <= 0:
            return
        fade = math.exp(-seconds / self.memory_s)
        for sums in self.sums.values():
            sums[0], sums[1] = sums[0] * fade, sums[1] * fade
        tokens = left - tokens_left if left is not None and tokens_left is not None else 0
        if rate and tokens > 0:
            sums = self.sums[drafting]
            sums[0], sums[1] = sums[0] + tokens / rate, sums[1] + seconds

    def begin(self, drafting: bool, predicted: float | None, tokens_left: int | None, now: float | None) -> None:
        """Open an interval at ``now`` (None: not timed, nothing counted) on the side chosen, predicted
        ``predicted`` tokens/s (None, or no token limit: the interval only fades the counts)."""
        self._open = None if now is None else (drafting, predicted if predicted and predicted > 0 else None,
                                                tokens_left, now)
