"""The machine's ceiling (``sim.perf.ceiling``) on timings worked by hand."""

from __future__ import annotations

import pytest

from sim.perf.ceiling import ceiling
from sim.perf.model import Timings


def timings(draft_s: float, alpha: list[float], verify_fixed_s: float = 0.1, verify_per_row_s: float = 0.01):
    return Timings(draft_s_per_token=draft_s, verify_fixed_s=verify_fixed_s, verify_per_token_s=verify_per_row_s,
                   alpha_per_position=alpha, up_bytes_fixed=0.0, up_bytes_per_draft=0.0, down_bytes_per_round=0.0,
                   down_bytes_per_token_cloud_only=0.0)


def test_a_perfect_free_drafter_drafts_as_long_as_the_ceiling_allows():
    best = ceiling(timings(0.0, [1.0]))  # every draft accepted, drafting free: AL(D) = D + 1 per verify(D + 1)
    assert best.draft_len == 16 and best.limited_by == "verify"
    assert best.tokens_per_s == pytest.approx(17 / (0.1 + 0.01 * 17))


def test_a_drafter_never_right_gets_one_token_a_forward():
    best = ceiling(timings(0.001, [0.0]))
    assert best.draft_len == 1 and best.tokens_per_s == pytest.approx(1 / (0.1 + 0.01 * 2))


def test_a_slow_drafter_sets_the_pace():
    best = ceiling(timings(0.2, [0.9]))  # a drafted token costs more than a forward over 17 rows
    assert best.limited_by == "draft"
    al_1 = 1 + 0.9  # the best here is one draft a block: AL(1) / (1 x 0.2 s)
    assert best.draft_len == 1 and best.tokens_per_s == pytest.approx(al_1 / 0.2)
    assert ceiling(timings(0.01, [])) is None  # no acceptance measured: no ceiling
