"""What each side of the controller's choice delivered against its predictions (``edge.realized_rate``),
and the controller leaving a drafter whose chains keep falling short of what it predicted for them."""

from __future__ import annotations

import math

import pytest

from edge.controller import Controller
from edge.realized_rate import RealizedRates


def test_the_ratio_is_predicted_over_taken_seconds_from_a_prior_of_one():
    rates = RealizedRates(prior_s=1.0, memory_s=10.0)
    assert rates.ratio(True) == rates.ratio(False) == 1.0
    rates.begin(3, True, tokens_left=64, now=0.0)
    rates.end(tokens_left=54, now=2.0, predicted={3: 10.0, 0: 8.0})  # 10 tokens predicted in 1 s took 2 s
    assert rates.ratio(True) == pytest.approx((1.0 + 1.0) / (1.0 + 2.0))
    assert rates.ratio(False) == 1.0  # the other side is untouched
    rates.end(tokens_left=40, now=5.0, predicted={3: 10.0})  # nothing open: nothing counted
    assert rates.ratio(True) == pytest.approx(2.0 / 3.0)
    rates.begin(0, False, tokens_left=40, now=5.0)  # a swap's interval: not counted ...
    rates.end(tokens_left=30, now=15.0, predicted={0: 8.0})
    fade = math.exp(-10.0 / 10.0)  # ... but its seconds fade both sides toward their bare predictions
    assert rates.ratio(True) == pytest.approx((1.0 + fade) / (1.0 + 2.0 * fade))
    assert rates.ratio(False) == 1.0
    rates.begin(0, True, tokens_left=30, now=15.0)
    rates.end(tokens_left=22, now=16.0, predicted={0: 8.0})  # the cloud alone as predicted
    assert rates.ratio(False) == pytest.approx(1.0)


@pytest.mark.parametrize("opened", [(3, True, None, 0.0), (3, True, 64, None), (5, True, 64, 0.0)])
def test_an_interval_without_a_limit_a_clock_or_a_prediction_counts_nothing(opened):
    rates = RealizedRates()
    rates.begin(*opened)
    rates.end(tokens_left=54, now=2.0, predicted={3: 10.0})  # (no prediction for draft length 5)
    rates.begin(3, True, tokens_left=64, now=0.0)
    rates.end(tokens_left=64, now=2.0, predicted={3: 10.0})  # no token committed
    assert rates.ratio(True) == 1.0
    with pytest.raises(ValueError):
        RealizedRates(prior_s=0.0)


def _marginal_drafter() -> Controller:
    """Drafting predicted about as fast as the cloud alone (9.99 against 10.0 tok/s), inside the hysteresis."""
    return Controller.converged(8, 4, alpha_per_position=[0.7], draft_s_per_token=0.038, network_s=0.13,
                                forward_s=0.145, cloud_s_per_token=0.1)


def _chains(controller: Controller, delivered: float, chains: int = 6, tokens: int = 8) -> list[int]:
    """Plan, then let each chain commit ``tokens`` at ``delivered`` times its prediction; the draft lengths chosen."""
    now, left, chosen = 0.0, 64, []
    plan = controller.plan(tokens_left=left, now=now)
    for _ in range(chains):
        chosen.append(plan.draft_len)
        rate = plan.predicted_tokens_per_s / controller.realized.ratio(plan.draft_len > 0)  # (the raw prediction)
        now, left = now + tokens / (rate * delivered), left - tokens
        plan = controller.plan(tokens_left=left, now=now)
    return [*chosen, plan.draft_len]


def test_a_drafter_that_delivers_short_of_its_prediction_is_handed_to_the_cloud():
    assert _chains(_marginal_drafter(), delivered=1.0) == [3] * 7  # the control: as predicted, it keeps drafting
    chosen = _chains(_marginal_drafter(), delivered=0.75)
    assert chosen[0] == 3 and chosen[-1] == 0 and chosen.index(0) <= 3  # within a few chains, not never


def test_an_untimed_controller_chooses_as_before():
    timed, untimed = _marginal_drafter(), _marginal_drafter()
    for left in (64, 56, 48):
        assert timed.plan(tokens_left=left, now=None) == untimed.plan(tokens_left=left)
    assert timed.realized.ratio(True) == 1.0
