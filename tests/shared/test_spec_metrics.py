"""SPEED-Bench's acceptance metrics (``shared.spec_metrics``), checked against histograms worked by hand
and against the acceptance lengths a real split generation records (``DecodeStats.accept_lengths``)."""

from __future__ import annotations

import pytest

from shared.spec_metrics import (
    acceptance_rates,
    average_request_al,
    llama_timings,
    mean_accept_length,
    merge,
    speculation_profile,
    vllm_request_metrics,
)
from shared.stats import DecodeStats

# 10 steps: 4 accepted nothing (length 1), 3 one draft, 2 two, 1 three.
HISTOGRAM = {1: 4, 2: 3, 3: 2, 4: 1}


def test_rates_and_means_of_a_histogram_worked_by_hand():
    conditional, joint = acceptance_rates(HISTOGRAM)
    assert joint == pytest.approx({1: 1.0, 2: 0.6, 3: 0.3, 4: 0.1})  # P(L >= k)
    assert conditional == pytest.approx({1: 1.0, 2: 0.6, 3: 0.5, 4: 1 / 3})  # P(L >= k | L >= k - 1)
    assert mean_accept_length(HISTOGRAM) == pytest.approx(2.0)  # (4 + 6 + 6 + 4) / 10
    assert average_request_al([{1: 1}, {3: 1}, {}]) == pytest.approx(2.0)  # per request, then averaged
    assert merge([{1: 1, 2: 2}, {2: 1, "5": 1}]) == {1: 1, 2: 3, 5: 1}
    assert acceptance_rates({}) == ({}, {}) and mean_accept_length({}) is None


def test_an_unobserved_length_between_observed_ones_keeps_the_rates_dense():
    conditional, joint = acceptance_rates({1: 2, 3: 2})
    assert joint == pytest.approx({1: 1.0, 2: 0.5, 3: 0.5}) and conditional == pytest.approx({1: 1.0, 2: 0.5, 3: 1.0})


def test_the_speculation_profile_passes_its_checks_and_fails_them_when_cut_short():
    profile = speculation_profile(HISTOGRAM, 3, request_histograms=[HISTOGRAM])
    assert profile["schema_version"] == "1.0" and profile["measured"]
    assert profile["marginal_accept_rates"] == pytest.approx([0.6, 0.3, 0.1])  # position i: length i + 2
    assert profile["conditional_accept_rates"] == pytest.approx([0.6, 0.5, 1 / 3], abs=1e-6)
    assert profile["mean_accept_length"] == pytest.approx(2.0)
    assert profile["validation"]["mean_consistency"]["passed"]  # 1 + 0.6 + 0.3 + 0.1 = 2.0
    assert profile["validation"]["marginal_monotonicity"]["passed"]
    # The control: a profile that claims fewer drafts a step than were measured fails its mean check.
    short = speculation_profile(HISTOGRAM, 1)
    assert not short["validation"]["mean_consistency"]["passed"]
    assert speculation_profile({}, 4)["measured"] is False


def test_vllm_and_llama_server_fields():
    fields = vllm_request_metrics(HISTOGRAM, drafted=40)
    assert fields == {"num_spec_steps": 10, "num_draft_tokens": 40, "num_accepted_draft_tokens": 10,
                      "mean_acceptance_length": 2.0, "draft_acceptance_rate": 0.25,
                      "acceptance_histogram": [4, 3, 2, 1]}  # dense: index j, the steps that accepted j drafts
    assert vllm_request_metrics({1: 2, 4: 1}, drafted=9)["acceptance_histogram"] == [2, 0, 0, 1]
    assert vllm_request_metrics({}, drafted=0) is None  # no speculative step: no object, as vLLM
    timings = llama_timings(prompt_tokens=20, prompt_s=0.5, predicted_tokens=30, predicted_s=3.0, drafted=40,
                            accepted=10)
    assert (timings["prompt_ms"], timings["predicted_per_second"], timings["draft_n_accepted"]) == (500.0, 10.0, 10)


def test_each_drafted_block_is_a_step_its_target_token_counted():
    stats = DecodeStats()
    stats.record_round(4, 4, 4, chain_continues=True)  # all accepted, its bonus deferred to the next block
    stats.record_round(4, 1, 2)  # one accepted, then the correction
    stats.record_round(4, 4, 5)  # four accepted and the bonus
    stats.record_round(0, 0, 1)  # the cloud decoding alone: no speculative step
    assert stats.accept_lengths == {5: 2, 2: 1}  # 1 + accepted each: vLLM's count
    ended = DecodeStats()
    ended.record_round(4, 3, 3)  # three accepted, and the generation ended there: still 1 + accepted
    assert ended.accept_lengths == {4: 1}
    assert mean_accept_length(stats.accept_lengths) == pytest.approx(1 + stats.accepted / 3)
    assert DecodeStats.from_json(stats.to_json()).accept_lengths == {5: 2, 2: 1}


def test_a_real_generation_s_steps_add_up_to_its_drafted_tokens(tiny_engine, tiny_models):
    """Over a split generation, the histogram's steps are the rounds that drafted and account for every
    accepted draft: its mean is the field's acceptance length, 1 + accepted drafts per step, exactly."""
    from helpers import GREEDY, tiny_drafter, tiny_prompt

    from edge.schedule import SpecConfig
    from sim.inprocess import generate

    drafter = tiny_drafter(tiny_models, "drafter_f32")
    try:
        got = generate(tiny_engine, drafter, tiny_prompt(tiny_engine, "The cat sat on the mat."), GREEDY,
                       max_new_tokens=40, spec=SpecConfig(4))
    finally:
        drafter.close()
    stats = got.stats
    steps = sum(stats.accept_lengths.values())
    assert steps == stats.drafted_at[0] > 0  # every round that drafted is a step (lock-step: no chains)
    assert sum((k - 1) * v for k, v in stats.accept_lengths.items()) == stats.accepted
    assert mean_accept_length(stats.accept_lengths) == pytest.approx(1 + stats.accepted / steps)
