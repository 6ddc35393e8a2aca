"""The row-cost curve (``edge.row_cost``) and what the controller does with it: a forward is priced by
the session's rows in it, so rows that cost alike (the verifier's tile) go to longer blocks and hedge
branches, and rows that cost do not."""

from __future__ import annotations

import pytest

from edge.controller import Controller
from edge.row_cost import RowCost


def test_rows_inside_the_tile_cost_alike_and_rows_past_it_follow_the_measured_line():
    curve = RowCost()
    assert curve.predict(1) is None and curve.extra(1, 4) is None  # nothing measured
    curve.set_tile(4)
    curve.observe(3, 0.10)
    assert curve.predict(1) == curve.predict(4) == curve.predict(9) == 0.10  # one point: flat
    curve.observe(8, 0.14)  # two tiles
    assert curve.predict(2) == 0.10 and curve.predict(7) == 0.14
    assert curve.predict(12) == pytest.approx(0.18) and curve.extra(4, 4) == pytest.approx(0.04)
    curve.observe(0, 0.5)
    curve.observe(5, 0.0)  # not reported: nothing learned
    assert curve.measured == {1: 0.10, 2: 0.14}


def test_more_rows_never_cost_less_and_a_new_tile_forgets_the_old_one():
    curve = RowCost()
    curve.observe(1, 0.20)
    curve.observe(5, 0.15)  # a noisy point below: the line stays flat, never falls
    assert curve.predict(9) >= 0.15 and curve.extra(5, 4) == 0.0 and curve.extra(1, 8) == 0.0
    curve.set_tile(16)
    assert curve.measured == {} and curve.tile == 16
    curve.set_tile(0)  # not said: every row counts
    assert curve.tile == 1


def _settled(*forwards: tuple[int, float], tile: int = 1) -> Controller:
    """A verifier-bound session (short network, two blocks in flight), α 0.7, the forward's cost
    measured at these (rows, seconds)."""
    c = Controller.converged(8, 2, alpha_per_position=[0.7], draft_s_per_token=0.005, network_s=0.02,
                           forward_s=0.1, cloud_s_per_token=0.1)
    c.set_row_tile(tile)
    for rows, seconds in forwards:
        c.observe_forward(rows, seconds)
    c.draft_len = 4
    return c


def test_the_controller_drafts_longer_blocks_where_rows_are_free_and_not_where_they_cost():
    free = _settled((5, 0.1), tile=16)  # a CPU in canonical shapes: 16 rows cost what one does
    assert free.plan().draft_len == 8
    costly = _settled((1, 0.1), (5, 0.14), (9, 0.18))  # free shapes: 10 ms a row
    assert costly.plan().draft_len == 4
    # One forward_s for every block (no rows reported) prices rows as free, as before the curve.
    assert _settled().plan().draft_len == 8


def test_hedge_branches_are_kept_where_the_tile_holds_their_rows_and_dropped_where_they_cost():
    def hedged(tile: int, hedged_forward_s: float) -> Controller:
        c = Controller(max_draft_len=4, window=2, cloud_window=16)
        c.hedge.allow(2, 3)
        c.set_row_tile(tile)
        for _ in range(16):
            c.plan()
            c.observe_block(drafted=4, accepted=3, trip_s=0.2, draft_s=0.02, cloud_s=0.05,
                            forward_s=0.0 if c.hedge_width else 0.05)
            c.observe_forward(5 + c.hedge_width * c.hedge.branch_len, hedged_forward_s if c.hedge_width else 0.05)
            if c.hedge_width:
                c.observe_hedge(gained=1, hedge_s=0.01)
        c.plan()
        return c

    free = hedged(tile=16, hedged_forward_s=0.05)  # the 6 branch rows ride in the tile
    assert free.hedge_extra_s() == pytest.approx(0.01) and free.hedge_width == 2
    costly = hedged(tile=1, hedged_forward_s=0.11)  # ... or cost 10 ms each
    assert costly.hedge_extra_s() > 0.05 and costly.hedge_width == 0  # branch drafting and 5-6 rows
