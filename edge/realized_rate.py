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
from collections.abc import Mapping

__all__ = ["RealizedRates"]


class RealizedRates:
    """Per side (drafting, the cloud alone), predicted over taken seconds of what was committed under it.

    ``begin`` opens an interval where the controller chose (its draft length, the tokens the limit left,
    the time); ``end`` at the next choice closes it and counts it: the tokens committed in it at the rate
    the controller predicts for that draft length once it has seen them, against the seconds they took. An interval that began with a swap is not
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
        self._open: tuple[int, bool, int | None, float] | None = None  # (draft length, counted, tokens left, began)

    def ratio(self, drafting: bool) -> float:
        """What that side delivered against its predictions: scale them by this (1.0 before any interval)."""
        predicted, taken = self.sums[drafting]
        return (self.prior_s + predicted) / (self.prior_s + taken)

    def end(self, tokens_left: int | None, now: float | None, predicted: Mapping[int, float]) -> None:
        """Close the open interval at ``now`` with ``tokens_left`` left (None for either: not measured),
        against ``predicted`` (tokens/s by draft length, 0: the cloud alone) as the controller predicts
        now, with what the interval's verdicts taught it: so what is counted is the model's error, not
        the lag of its acceptance estimate behind a hard stretch."""
        opened, self._open = self._open, None
        if opened is None or now is None:
            return
        draft_len, counted, left, began = opened
        seconds = now - began
        if seconds <= 0:
            return
        fade = math.exp(-seconds / self.memory_s)
        for sums in self.sums.values():
            sums[0], sums[1] = sums[0] * fade, sums[1] * fade
        tokens = left - tokens_left if left is not None and tokens_left is not None else 0
        rate = predicted.get(draft_len)
        if counted and rate and rate > 0 and tokens > 0:
            sums = self.sums[draft_len > 0]
            sums[0], sums[1] = sums[0] + tokens / rate, sums[1] + seconds

    def begin(self, draft_len: int, counted: bool, tokens_left: int | None, now: float | None) -> None:
        """Open an interval at ``now`` (None: not timed) under ``draft_len`` (0: the cloud alone);
        ``counted`` False (a swap's interval), or no token limit: it only fades the counts."""
        self._open = None if now is None else (draft_len, counted, tokens_left, now)
