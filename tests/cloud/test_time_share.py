"""The verifier's time shared across forwards (``cloud.time_share``): the cost fit, and who waits a turn.

Pure: a simulated verifier whose forwards cost what the test says, two clients always waiting.
"""

from __future__ import annotations

import pytest

from cloud.time_share import ForwardCost, TimeShare


def test_the_cost_fit_recovers_a_fixed_and_a_per_row_cost():
    cost = ForwardCost()
    assert cost.fixed_s == 0 and cost.per_row_s == 0  # nothing measured yet
    for rows in [5, 20, 9, 68, 13, 40] * 10:
        cost.add(rows, 5e-3 + 2e-4 * rows)
    assert cost.fixed_s == pytest.approx(5e-3, rel=1e-6) and cost.per_row_s == pytest.approx(2e-4, rel=1e-6)
    same = ForwardCost()
    for _ in range(10):
        same.add(8, 0.01)  # rows never varied: all of it fixed
    assert same.per_row_s == 0 and same.fixed_s == pytest.approx(0.01)


def _share_of_forwards(fixed_s: float, per_row_s: float, light: int, heavy: int, weights=None, steps: int = 400,
                       timed: bool = True) -> tuple[float, float]:
    """Two clients always waiting, ``light`` and ``heavy`` rows each; forwards cost ``fixed_s + per_row_s *
    rows``. Returns (the heavy client's fraction of forwards, its fraction of the verifier's time)."""
    cost, share = ForwardCost(), TimeShare()
    weights = weights or {}
    spent = {"light": 0.0, "heavy": 0.0}
    ran = {"light": 0, "heavy": 0}
    demand = {"light": light, "heavy": heavy}
    for step in range(steps):
        cost.add(light + heavy + step % 3, fixed_s + per_row_s * (light + heavy + step % 3))  # (rows vary a little)
        clients = share.eligible(demand, cost) if timed else set(demand)
        rows = {c: demand[c] for c in clients}
        share.charge(rows, cost, weights)
        for c in clients:
            ran[c] += 1
            spent[c] += fixed_s / len(clients) + per_row_s * rows[c]
    return ran["heavy"] / steps, spent["heavy"] / sum(spent.values())


def test_where_rows_cost_nothing_nobody_waits_a_turn():
    assert _share_of_forwards(fixed_s=0.01, per_row_s=0.0, light=5, heavy=68) == (1.0, 0.5)


def test_where_rows_cost_time_each_client_gets_about_half_of_it():
    forwards, time_share = _share_of_forwards(fixed_s=5e-3, per_row_s=2e-4, light=5, heavy=68)
    assert forwards < 0.5 and time_share == pytest.approx(0.5, abs=0.05)
    # The control: every client in every forward, the heavy one takes most of the time.
    forwards, time_share = _share_of_forwards(fixed_s=5e-3, per_row_s=2e-4, light=5, heavy=68, timed=False)
    assert forwards == 1.0 and time_share > 0.7


def test_a_client_whose_rows_commit_less_gets_less_time():
    _, even = _share_of_forwards(fixed_s=5e-3, per_row_s=2e-4, light=5, heavy=17)
    _, weighed = _share_of_forwards(fixed_s=5e-3, per_row_s=2e-4, light=5, heavy=17,
                                    weights={"light": 0.6, "heavy": 0.3})
    assert weighed == pytest.approx(1 / 3, abs=0.05) and weighed < even - 0.1


def test_a_client_back_from_away_gets_no_credit_and_clocks_are_bounded():
    cost, share = ForwardCost(), TimeShare(max_clients=3)
    for rows in (4, 40, 4, 40):
        cost.add(rows, 5e-3 + 2e-4 * rows)
    for _ in range(50):  # only "a" runs for a while
        assert share.eligible({"a": 10}, cost) == {"a"}
        share.charge({"a": 10}, cost, {})
    assert share.eligible({"a": 10, "b": 10}, cost) >= {"b"}  # b starts where a is, not 50 forwards behind it
    for _ in range(3):
        share.charge({"a": 10, "b": 10}, cost, {})
    assert "b" in share.eligible({"a": 10, "b": 10}, cost) and "a" in share.eligible({"a": 10, "b": 10}, cost)
    for client in ("c", "d", "e"):
        share.charge({client: 1}, cost, {})
    assert len(share.clocks) == 3 and "a" not in share.clocks
    assert share.eligible({"x": 1}, cost) == {"x"} and share.eligible({}, cost) == set()
