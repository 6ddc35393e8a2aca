"""The category bench: MT-bench's questions from the installed package, and the per-category figures
(``sim.experiment.categories.summarize``) worked by hand on reports whose numbers are known."""

from __future__ import annotations

import pytest

from edge.drafter import DrafterStats
from edge.report import EdgeReport
from shared.stats import DecodeStats
from sim.experiment.categories import (
    CategoryBench,
    first_turn_sampling,
    paired_summary,
    probe_question,
    probe_questions,
    render_first_turn,
    second_turn_prompts,
    summarize,
    table,
)
from sim.workloads.mtbench import questions, sample_by_category

CATEGORIES = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]


def test_mt_bench_has_80_two_turn_questions_in_8_categories_of_10():
    every = questions()
    assert len(every) == 80 and all(len(q.turns) == 2 for q in every)
    assert list(sample_by_category(None)) == CATEGORIES
    sampled = sample_by_category(2, seed=0)
    assert [len(items) for items in sampled.values()] == [2] * 8
    assert sampled == sample_by_category(2, seed=0) and sampled != sample_by_category(2, seed=1)
    assert render_first_turn("Hi?") == "<start_of_turn>user\nHi?<end_of_turn>\n<start_of_turn>model\n"


def test_the_paired_probes_take_one_question_a_category_from_the_bench_s_draw():
    probes = probe_questions()
    drawn = [q for items in sample_by_category(2, 0).values() for q in items]
    assert len(probes) == len({c for c, _ in probes}) == 8 and all(q in drawn for _, q in probes)
    args = first_turn_sampling(probes[0][1], seed=3)
    assert args[args.index("--prompt") + 1] == render_first_turn(probes[0][1].turns[0])
    assert args[args.index("--seed") + 1] == "3" and args[args.index("--mode") + 1] == "coupled"
    first = probes[0][1]
    assert probe_question(first.question_id) == first  # a probe script names its question by MT-bench id
    outside = next(q.question_id for q in drawn if q not in [p for _, p in probes])
    with pytest.raises(ValueError, match=str(first.question_id)):  # another id: the ones the probes run, named
        probe_question(outside)


def test_a_second_turn_is_the_conversation_so_far_with_the_first_answer():
    assert second_turn_prompts([("Q1?", "Q2?")], ["A1."]) == [
        "<start_of_turn>user\nQ1?<end_of_turn>\n<start_of_turn>model\nA1.<end_of_turn>\n"
        "<start_of_turn>user\nQ2?<end_of_turn>\n<start_of_turn>model\n"]
    with pytest.raises(ValueError):
        second_turn_prompts([("Q1?", "Q2?")], [])  # an answer for each question
    with pytest.raises(ValueError, match="1 or 2 turns"):
        CategoryBench(scenario=None, target="", drafters=[], turns=3)


def report(tokens: int, wall_s: float, lengths: dict[int, int], *, drafted: int = 0, accepted: int = 0,
           up: int = 0, restart_s: float = 0.0, drafter: DrafterStats | None = None) -> EdgeReport:
    stats = DecodeStats(drafted=drafted, accepted=accepted, accept_lengths=lengths, restart_draft_s=restart_s)
    return EdgeReport("split", [1] * tokens, "", "length", 5, wall_s, 0.5, 0.0, 0.0, up, 0, 0.0, decode=stats,
                      drafter=drafter or DrafterStats())


def test_per_category_figures_from_known_reports():
    categories = ["math", "math", "coding"]
    cloud_only = [report(10, 2.0, {}), report(10, 2.0, {}), report(10, 1.0, {})]  # 5, 5, 10 tok/s
    split = [report(10, 1.0, {3: 2, 1: 1}, drafted=12, accepted=4, up=100, restart_s=0.25,  # 10 tok/s: 2.0x
                    drafter=DrafterStats(drafted=16, draft_s=0.5)),
             report(10, 0.5, {4: 1}, drafted=4, accepted=3, up=60,  # 20 tok/s: 4.0x
                    drafter=DrafterStats(drafted=8, draft_s=0.1)),
             report(10, 2.0, {1: 2}, drafted=8, accepted=0, up=50)]  # 5 tok/s: 0.5x, lost
    samples = [[(5, 0.1)], [(5, 0.1)], [(5, 0.2)]]
    # One-row steps: the first prompt's split ran them 1.5x cloud-only's (mean 0.06 s over 0.04), the second
    # ran none, the third 1.0x; mixed with the steps of other shapes, which do not count.
    split_samples = [[(1, 0.05), (1, 0.07), (5, 0.1)], [(5, 0.1)], [(1, 0.02), (5, 0.2)]]
    cloud_samples = [[(1, 0.04)] * 3, [(1, 0.04)], [(1, 0.02), (2, 0.09)]]
    ratios = summarize(categories, (cloud_only, cloud_samples), {"d": (split, split_samples)})["d"]
    assert [p["one_row_step_ratio"] for p in ratios["prompts"]] == [pytest.approx(1.5), None, pytest.approx(1.0)]
    assert ratios["all"]["one_row_step_ratio"] == {"median": pytest.approx(1.25), "min": pytest.approx(1.0),
                                                    "max": pytest.approx(1.5)}
    assert "\n  slower than cloud-only: coding 0.50x (AL 1.00, 10 tokens, one-row steps 1.00x cloud-only's)\n" in \
        table({"drafters": {"d": ratios}})
    assert "one-row steps against cloud-only's on the same prompt: median 1.25x (1.00-1.50;" in \
        table({"drafters": {"d": ratios}})
    out = summarize(categories, (cloud_only, samples), {"d": (split, samples)})["d"]
    assert out["all"]["one_row_step_ratio"] is None and "one-row" not in table({"drafters": {"d": out}})
    math, coding, overall = out["categories"]["math"], out["categories"]["coding"], out["all"]
    assert math["prompts"] == 2 and math["acceptance_length"] == pytest.approx((3 * 2 + 1 + 4) / 4)
    assert math["acceptance_length_per_request"] == pytest.approx(((7 / 3) + 4) / 2)
    assert math["speedup"] == {"median": 3.0, "min": 2.0, "max": 4.0} and math["lost_share"] == 0.0
    assert math["bytes_per_accepted_token"] == pytest.approx(160 / 7)
    assert math["restart_draft_share"] == pytest.approx(0.25 / 1.5)
    assert overall["restart_draft_share"] == pytest.approx(0.25 / 3.5)
    assert math["drafting_share"] == pytest.approx(0.6 / 1.5) and math["drafts_never_verified"] == pytest.approx(1 - 16 / 24)
    assert coding["drafts_never_verified"] is None  # its drafter's counters say nothing
    assert coding["speedup"]["median"] == 0.5 and coding["lost_share"] == 1.0 and coding["acceptance_length"] == 1.0
    assert coding["bytes_per_accepted_token"] is None  # nothing accepted
    assert overall["lost_share"] == pytest.approx(1 / 3) and overall["speedup"]["median"] == 2.0
    assert overall["cloud_s_per_token"] == pytest.approx(0.4 / 30)
    assert [(p["category"], p["speedup"], p["tokens"], p["acceptance_length"]) for p in out["prompts"]] == [
        ("math", 2.0, 10, pytest.approx(7 / 3)), ("math", 4.0, 10, 4.0), ("coding", 0.5, 10, 1.0)]
    assert "\n  slower than cloud-only: coding 0.50x (AL 1.00, 10 tokens)\n" in table({"drafters": {"d": out}})
    out["prompts"][2]["question_id"] = 126  # (run_categories names each prompt by its MT-bench question)
    assert "\n  slower than cloud-only: coding #126 0.50x (AL 1.00, 10 tokens)\n" in table({"drafters": {"d": out}})
    profile = out["speculation_profile"]
    assert profile["num_speculative_tokens"] == 3 and profile["validation"]["mean_consistency"]["passed"]
    assert profile["per_category"]["math"]["prompts"] == 2


def test_a_prompt_run_several_times_counts_once_at_the_median_of_its_runs():
    # Two prompts (math, coding), three runs each, the whole list over again; each run against its own
    # cloud-only (10 tok/s every run): math 1.0x, 2.0x, 1.25x; coding 0.5x, 0.8x, 1.25x.
    categories = ["math", "coding"] * 3
    cloud_only = [report(10, 1.0, {})] * 6
    split = [report(10, wall, {2: 1}) for wall in (1.0, 2.0, 0.5, 1.25, 0.8, 0.8)]
    split_steps = [[(1, 0.05)], [(1, 0.05)], [(1, 0.06)], [(1, 0.04)], [(1, 0.07)], [(5, 0.1)]]
    cloud_steps = [[(1, 0.05)]] * 6
    out = summarize(categories, (cloud_only, cloud_steps), {"d": (split, split_steps)}, runs_per_prompt=3)["d"]
    math, coding = out["prompts"]
    assert (math["category"], coding["category"]) == ("math", "coding")
    assert math["run_speedups"] == pytest.approx([1.0, 2.0, 1.25]) and math["speedup"] == pytest.approx(1.25)
    assert coding["run_speedups"] == pytest.approx([0.5, 0.8, 1.25]) and coding["speedup"] == pytest.approx(0.8)
    assert math["one_row_step_ratio"] == pytest.approx(1.2)  # (1.0, 1.2, 1.4)
    assert coding["one_row_step_ratio"] == pytest.approx(0.9)  # (1.0, 0.8; its last run ran no one-row step)
    overall = out["all"]
    assert overall["prompts"] == 2 and overall["runs_per_prompt"] == 3
    assert overall["speedup"] == {"median": pytest.approx(1.025), "min": pytest.approx(0.8), "max": pytest.approx(1.25)}
    assert overall["lost_share"] == 0.5 and out["categories"]["coding"]["lost_share"] == 1.0
    assert "coding 0.80x (AL 2.00, 10 tokens, 3 runs 0.50-1.25x, one-row steps 0.90x cloud-only's)" in \
        table({"drafters": {"d": out}})
    with pytest.raises(ValueError, match="not 4 runs of each prompt"):
        summarize(categories, (cloud_only, cloud_steps), {"d": (split, split_steps)}, runs_per_prompt=4)


def test_a_paired_probe_closes_with_each_arm_s_median_and_the_median_of_the_ratios():
    rows = [("q2_k", 1.0, 1.2, 0.8, 0.6), ("q2_k", 2.0, 1.8, 0.5, 0.5), ("q2_k", 0.9, 1.0, 1.0, 0.9)]
    assert paired_summary(["q2_k"], rows) == [
        "q2_k     A: median 1.00x (0.90-2.00), cloud cost 0.800 of cloud-only's",
        "q2_k     B: median 1.20x (1.00-1.80), cloud cost 0.600 of cloud-only's",
        "q2_k     paired B/A speed 1.111, cloud cost 0.900",  # (1.2, 0.9, 1.111...; 0.75, 1.0, 0.9)
    ]
