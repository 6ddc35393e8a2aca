"""Whether a session's blocks carry hedge branches: the controller's choice, with what it measured.

Hedging is tried after ``HEDGE_PROBE_BLOCKS`` plain blocks, then measured over
as many hedged ones, then kept only while a hedged block's gain in tokens beats
its extra seconds (its branches' drafting, and what their rows add to the
forward on the row-cost curve) at the plan's predicted rate, by a hysteresis
margin. Pure bookkeeping: ``edge.controller`` feeds it and asks.
"""

from __future__ import annotations

from edge.row_cost import RowCost
from shared.stats import Ewma

__all__ = ["HedgeChoice", "HEDGE_PROBE_BLOCKS"]

HEDGE_PROBE_BLOCKS = 8  # blocks measured without hedges, then with them, before hedging is weighed


class HedgeChoice:
    """Hedge branches per block (``width``), within the caller's ``cap`` of ``branch_len`` tokens each."""

    def __init__(self) -> None:
        self.cap = 0  # branches per block the caller and the verifier allow (0: never hedge)
        self.branch_len = 0  # tokens per branch
        self.gain = Ewma()  # tokens a hedged block's taken branch committed past its correction (0: none taken)
        self.draft_s = Ewma()  # the edge's time drafting a block's branches
        self.hedged = 0  # hedged blocks observed
        self.on = False  # the current choice

    def allow(self, cap: int, branch_len: int) -> None:
        """The caller's and the verifier's bound: ``cap`` branches of ``branch_len`` tokens."""
        self.cap, self.branch_len = cap, branch_len

    def width(self, drafting: bool) -> int:
        """Branches for the next block: the cap while hedging and drafting, else 0."""
        return self.cap if self.on and drafting else 0

    def observe(self, gained: int, draft_s: float) -> None:
        """A hedged block's verdict: ``gained`` tokens its taken branch committed
        past the correction (0: none taken), ``draft_s`` spent drafting its branches."""
        self.hedged += 1
        self.gain.add(gained)
        self.draft_s.add(draft_s)

    def extra_s(self, forward_cost: RowCost, draft_len: int) -> float:
        """Seconds a hedged block of ``draft_len`` drafts adds: its branches' drafting, and what their rows
        add to the block's forward (nothing where the tile holds them, or the cloud reports no rows)."""
        rows = forward_cost.extra(draft_len + 1, self.cap * self.branch_len)
        return (self.draft_s.value or 0.0) + (rows or 0.0)

    def choose(self, rate: float | None, forward_cost: RowCost, draft_len: int, hysteresis: float,
               blocks: int) -> None:
        """Hedge or not, ``blocks`` drafted blocks observed: off until ``HEDGE_PROBE_BLOCKS`` plain ones were,
        then on until as many hedged ones were, then on while a hedged block's gain beats its extra seconds
        at ``rate`` (tokens/s predicted for the plan) by the ``hysteresis`` margin."""
        if not self.cap or blocks - self.hedged < HEDGE_PROBE_BLOCKS:
            self.on = False
        elif self.hedged < HEDGE_PROBE_BLOCKS:
            self.on = True
        elif rate is not None:
            margin = 1 + hysteresis
            worth = self.extra_s(forward_cost, draft_len) * rate * (1 / margin if self.on else margin)
            self.on = self.gain.value > worth

    def describe(self, width: int, extra_s: float) -> str:
        """One clause for a plan's log line, hedging ``width`` branches that add ``extra_s`` (empty when
        hedging is not allowed)."""
        if not self.cap:
            return ""
        return (f"; hedge {width} of {self.cap} (a hedged block gains {self.gain.value or 0.0:.2f} tokens for "
                f"{extra_s * 1e3:.0f} ms, {self.hedged} measured)")
