"""The machine's ceiling (``sim.perf.ceiling``) on timings worked by hand."""

from __future__ import annotations

import pytest

from sim.perf.ceiling import ceiling, per_prompt_efficiency, steady_rate
from sim.perf.model import Timings


def timings(draft_s: float, alpha: list[float], verify_fixed_s: float = 0.1, verify_per_row_s: float = 0.01):
    return Timings(draft_s_per_token=draft_s, verify_fixed_s=verify_fixed_s, verify_per_token_s=verify_per_row_s,
                   alpha_per_position=alpha, up_bytes_fixed=0.0, up_bytes_per_draft=0.0, down_bytes_per_round=0.0,
                   down_bytes_per_token_cloud_only=0.0)


def test_a_perfect_free_drafter_drafts_as_long_as_the_ceiling_allows():
    best = ceiling(timings(0.0, [1.0]))  # every draft accepted, drafting free: AL(D) = D + 1 per verify(D + 1)
    assert best.draft_len == 16 and best.limited_by == "verify"
    assert best.tokens_per_s == pytest.approx(17 / (0.1 + 0.01 * 17))


def test_a_drafter_never_right_leaves_the_cloud_alone_as_the_ceiling():
    best = ceiling(timings(0.001, [0.0]))  # any block commits one token, over more rows than alone
    assert best.draft_len == 0 and best.tokens_per_s == pytest.approx(1 / (0.1 + 0.01 * 1))
    weak = ceiling(timings(0.001, [0.1]))  # AL(1) = 1.1 over two rows beats one row's forward
    assert weak.draft_len >= 1 and weak.tokens_per_s > 1 / (0.1 + 0.01 * 1)


def test_the_steady_rate_leaves_the_first_token_out():
    assert steady_rate(11, wall_s=2.5, ttft_s=0.5) == pytest.approx(10 / 2.0)
    assert steady_rate(1, wall_s=2.5, ttft_s=0.5) is None and steady_rate(5, wall_s=0.5, ttft_s=0.5) is None


def test_per_prompt_efficiency_reads_each_prompt_against_its_own_ceiling():
    # Prompt 0 made half its ceiling, prompt 1 a fifth, prompt 2 has no steady rate (one token).
    out = per_prompt_efficiency([10.0, 4.0, None], [20.0, 20.0, 30.0], best=[16.0, 8.0, 30.0])
    assert out["prompts"] == 2 and out["min"] == pytest.approx(0.2) and out["max"] == pytest.approx(0.5)
    assert out["median"] == pytest.approx(0.35)
    assert out["best_schedule"] == pytest.approx((0.8 + 0.4) / 2)  # what the best schedule leaves of the ceiling
    assert out["of_best_schedule"] == pytest.approx((10 / 16 + 4 / 8) / 2)  # what the run made of that
    assert per_prompt_efficiency([10.0], [20.0])["best_schedule"] is None
    assert per_prompt_efficiency([None], [20.0]) is None


def test_a_slow_drafter_sets_the_pace():
    best = ceiling(timings(0.2, [0.9]))  # a drafted token costs more than a forward over 17 rows
    assert best.limited_by == "draft"
    al_1 = 1 + 0.9  # the best here is one draft a block: AL(1) / (1 x 0.2 s)
    assert best.draft_len == 1 and best.tokens_per_s == pytest.approx(al_1 / 0.2)
    assert ceiling(timings(0.01, [])) is None  # no acceptance measured: no ceiling
