"""Figures computed from the result record's files: pure, files in, ``Figure`` records out.

Three kinds of file carry figures; every other file carries none:

- ``splitspec sim run``'s ``result.json`` (it has ``headlines``): per scenario, drafter and sessions
  (``auto``: as opened; ``reproducible``), the median over the folder's runs of each run's median over its
  prompts of the ratio to the fastest cloud-only, and the runs' range; the cloud CPU a token against the
  fastest cloud-only's; how many runs were token-identical to their yardstick; the cloud-only rates; the
  fitted drafter and lone-forward costs (free shapes);
- ``splitspec bench capacity --json`` (it has ``capacity_at_slo``): what canonical shapes cost each mode
  and load, free shapes' aggregate tok/s over canonical shapes';
- ``splitspec bench categories``'s ``result.json`` (``"bench": "categories"``): per drafter AL, the speedup,
  the prompts lost, the worst category, the efficiency against the machine's ceiling.

Each figure is printed as the README prints it (ratios to 2 decimals with ×, rates to 1 decimal) and
names the files it is computed from. ``FIGURE_MEANINGS`` says what each name means.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Iterable
from pathlib import Path

from sim.experiment.record import Figure, ResultFile, short_commit

__all__ = ["FIGURE_MEANINGS", "folder_figures", "folder_machines", "folder_commits"]

SESSIONS = ("auto", "reproducible")
DRAFTER_MS = re.compile(r"([0-9.]+) ms per drafted token")
LONE_FORWARD_MS = re.compile(r"t_verify\(1\) = ([0-9.]+) ms")

# The last part of a figure's name -> what it is (baseline.md prints these).
FIGURE_MEANINGS = {
    "speedup": "split tok/s over the fastest cloud-only of the same run (a lone session in free shapes): "
               "the median over the runs of each run's median over its prompts",
    "speedup-range": "the lowest and highest of those runs' medians (categories: of the prompts')",
    "runs": "how many runs the speedup is the median of",
    "cloud-cpu": "the split's cloud CPU a token over the fastest cloud-only's, the median over the runs",
    "identical": "runs whose every output was token-identical to the yardstick: the fastest cloud-only "
                 "(auto) or reproducible cloud-only (reproducible)",
    "tok-s": "the fastest cloud-only's tok/s, the range over the runs",
    "reproducibility-price": "free shapes' tok/s over canonical (reproducible) shapes', the range over runs",
    "drafter-ms": "the drafter's fitted cost a drafted token (free shapes), the range over the runs",
    "lone-forward-ms": "the target's fitted cost for a one-row forward (free shapes), the range over the runs",
    "rtt": "the link's round trip as the scenario sets it",
    "al": "acceptance length, 1 + accepted drafts per drafted block (vLLM's and SPEED-Bench's count)",
    "lost": "prompts where the split was slower than the same prompt's fastest cloud-only",
    "worst": "the category with the lowest median speedup, and its AL",
    "efficiency": "the run's tok/s over the machine's ceiling (the best steady rate its measured costs "
                  "allow, rejections free)",
    "efficiency-per-prompt": "each prompt's tok/s after its first token over its own ceiling (its own "
                             "acceptance): the median and range over prompts",
    "best-schedule": "the share of each prompt's ceiling that the performance model's best schedule reaches "
                     "once rejections cost what they cost here: the median over prompts",
    "machine": "the machines the folder's files name",
    "commits": "the commits the folder's files name",
}


def ratio(value: float) -> str:
    return f"{value:.2f}×"


def span(values: Iterable[float], digits: int = 2) -> str:
    """``low–high`` at ``digits`` decimals, or one number when both print the same."""
    ordered = sorted(values)
    low, high = f"{ordered[0]:.{digits}f}", f"{ordered[-1]:.{digits}f}"
    return low if low == high else f"{low}–{high}"


def is_sim_run(file: ResultFile) -> bool:
    return isinstance(file.data, dict) and "headlines" in file.data and "baselines" in file.data


def is_capacity(file: ResultFile) -> bool:
    return isinstance(file.data, dict) and "capacity_at_slo" in file.data


def is_categories(file: ResultFile) -> bool:
    return isinstance(file.data, dict) and file.data.get("bench") == "categories"


def run_entry(file: ResultFile, config: str) -> dict:
    """The ``runs`` entry of a sim run that a headline's ``config`` names."""
    return next(run for run in file.data["runs"] if run.get("label") == config)


def headline_figures(scenario: str, files: list[ResultFile]) -> list[Figure]:
    """Per drafter and sessions kind: speedup, its range and run count, cloud CPU a token, identical runs."""
    found: dict[tuple[str, str], list[tuple[ResultFile, dict]]] = {}
    for file in files:
        for drafter, kinds in file.data["headlines"].items():
            for sessions in SESSIONS:
                if sessions in kinds:
                    found.setdefault((drafter, sessions), []).append((file, kinds[sessions]))
    figures = []
    for (drafter, sessions), runs in found.items():
        key, sources = f"{scenario}/{Path(drafter).stem}/{sessions}", tuple(file for file, _ in runs)
        medians = [headline["median"] for _, headline in runs]
        cpu = [run_entry(file, headline["config"])["ratios"]["cloud_cpu_s_per_token"] for file, headline in runs]
        yardstick = "identical_to_reproducible" if sessions == "reproducible" else "identical_to_fastest"
        identical = sum(headline.get(yardstick) is True for _, headline in runs)
        figures += [Figure(f"{key}/speedup", ratio(statistics.median(medians)), sources),
                    Figure(f"{key}/runs", str(len(runs)), sources),
                    Figure(f"{key}/cloud-cpu", ratio(statistics.median(cpu)), sources),
                    Figure(f"{key}/identical", f"{identical} of {len(runs)}", sources)]
        if len(runs) > 1:
            figures.append(Figure(f"{key}/speedup-range", span(medians), sources))
    return figures


def cloud_only_figures(scenario: str, files: list[ResultFile]) -> list[Figure]:
    """The cloud-only rates, the price of reproducibility, the link's RTT, all reproducible runs identical."""
    sources = tuple(files)
    fastest = [file.data["baselines"]["fastest"]["tokens_per_s"] for file in files]
    figures = [Figure(f"{scenario}/cloud-only/tok-s", span(fastest, 1), sources),
               Figure(f"{scenario}/rtt", f"{span((f.data['link']['rtt_ms'] for f in files), 0)} ms", sources)]
    both = [file for file in files if file.data["baselines"].get("reproducible")]
    if both:
        prices = [f.data["baselines"]["fastest"]["tokens_per_s"] / f.data["baselines"]["reproducible"]["tokens_per_s"]
                  for f in both]
        figures.append(Figure(f"{scenario}/cloud-only/reproducibility-price", f"{span(prices)}×", tuple(both)))
    reproducible = [(file, kinds["reproducible"]) for file in files
                    for kinds in file.data["headlines"].values() if "reproducible" in kinds]
    if reproducible:
        identical = sum(headline.get("identical_to_reproducible") is True for _, headline in reproducible)
        holders = tuple(sorted({file.name: file for file, _ in reproducible}.values(), key=lambda f: f.name))
        figures.append(Figure(f"{scenario}/reproducible/identical", f"{identical} of {len(reproducible)}", holders))
    return figures


def fit_figures(scenario: str, files: list[ResultFile]) -> list[Figure]:
    """The performance model's fitted costs in free shapes (``model_fit.auto``), where a run fitted them."""
    figures = []
    for name, pattern, field in (("drafter-ms", DRAFTER_MS, "drafter"),
                                 ("lone-forward-ms", LONE_FORWARD_MS, "t_verify(n)")):
        found = [(file, pattern.search(file.data.get("model_fit", {}).get("auto", {}).get(field, "")))
                 for file in files]
        found = [(file, float(match.group(1))) for file, match in found if match]
        if found:
            figures.append(Figure(f"{scenario}/fit/{name}", span((ms for _, ms in found), 1),
                                  tuple(file for file, _ in found)))
    return figures


def sim_run_figures(files: list[ResultFile]) -> list[Figure]:
    """Every sim-run figure of a folder, scenario by scenario (a folder may hold several scenarios)."""
    by_scenario: dict[str, list[ResultFile]] = {}
    for file in files:
        by_scenario.setdefault(file.data["scenario"], []).append(file)
    figures = []
    for scenario, runs in sorted(by_scenario.items()):
        figures += headline_figures(scenario, runs) + cloud_only_figures(scenario, runs) + fit_figures(scenario, runs)
    return figures


def capacity_figures(file: ResultFile) -> list[Figure]:
    """Per mode and load: free shapes' aggregate tok/s over canonical shapes' (what reproducibility costs)."""
    rates: dict[tuple[str, int], dict[str, float]] = {}
    for run in file.data["runs"]:
        rates.setdefault((run["mode"], run["sessions"]), {})[run["shapes"]] = run["aggregate_tokens_per_s"]
    return [Figure(f"{mode}/{sessions}/reproducibility-price", ratio(shapes["free"] / shapes["canonical"]), (file,))
            for (mode, sessions), shapes in rates.items() if {"free", "canonical"} <= set(shapes)]


def categories_figures(file: ResultFile) -> list[Figure]:
    """Per drafter over all prompts: AL, speedup and its range, prompts lost, worst category, efficiency
    (pooled; per prompt, its median and range, and what the model's best schedule leaves of the ceiling,
    where the result has them)."""
    figures = []
    for drafter, result in file.data["drafters"].items():
        key, overall, ceiling = Path(drafter).stem, result["all"], result["ceiling"]
        worst_name, worst = min(result["categories"].items(), key=lambda item: item[1]["speedup"]["median"])
        lost = round(overall["lost_share"] * overall["prompts"])
        figures += [
            Figure(f"{key}/al", f"{overall['acceptance_length']:.2f}", (file,)),
            Figure(f"{key}/speedup", ratio(overall["speedup"]["median"]), (file,)),
            Figure(f"{key}/speedup-range", span([overall["speedup"]["min"], overall["speedup"]["max"]]), (file,)),
            Figure(f"{key}/lost", f"{lost} of {overall['prompts']}", (file,)),
            Figure(f"{key}/worst", f"{worst_name} {ratio(worst['speedup']['median'])} "
                                   f"(AL {worst['acceptance_length']:.2f})", (file,)),
            Figure(f"{key}/efficiency", f"{ceiling['efficiency']:.0%} of {ceiling['ceiling_tokens_per_s']:.1f} tok/s",
                   (file,)),
        ]
        each = ceiling.get("per_prompt_efficiency")  # (results from 2026-12-05 on)
        if each:
            figures.append(Figure(f"{key}/efficiency-per-prompt", f"{each['median']:.0%} "
                                  f"({each['min']:.0%}-{each['max']:.0%})", (file,)))
            if each["best_schedule"] is not None:
                figures.append(Figure(f"{key}/best-schedule", f"{each['best_schedule']:.0%}", (file,)))
    return figures


def folder_machines(files: Iterable[ResultFile]) -> str:
    """The distinct machines the files name, in first-seen order ("not recorded" when none does)."""
    machines = dict.fromkeys(file.provenance.machine for file in files if file.provenance.machine)
    return "; ".join(machines) or "not recorded"


def folder_commits(files: Iterable[ResultFile]) -> str:
    """The distinct commits the files name, short, in first-seen order ("not recorded" when none does)."""
    commits = dict.fromkeys(short_commit(file.provenance.commit) for file in files if file.provenance.commit)
    return ", ".join(f"`{commit}`" for commit in commits) or "not recorded"


def folder_figures(files: list[ResultFile]) -> list[Figure]:
    """Every figure one question folder's files carry, plus the folder's ``machine`` and ``commits``.

    Raises ``ValueError`` when two files would give the same figure name (two capacity or categories
    files in one folder: one question, one file of each).
    """
    kinds: list[tuple[Callable[[ResultFile], bool], Callable]] = [
        (is_capacity, capacity_figures), (is_categories, categories_figures)]
    figures = sim_run_figures([file for file in files if is_sim_run(file)])
    for accepts, compute in kinds:
        for file in files:
            if accepts(file):
                figures += compute(file)
    carrying = sorted({file.link: file for figure in figures for file in figure.sources}.values(),
                      key=lambda file: file.name)
    if carrying:
        figures += [Figure("machine", folder_machines(carrying), tuple(carrying)),
                    Figure("commits", folder_commits(carrying), tuple(carrying))]
    names = [figure.key for figure in figures]
    if len(set(names)) < len(names):
        raise ValueError(f"{files[0].folder}: two files give the same figures; one question, one file of each")
    return figures
