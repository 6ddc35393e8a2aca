"""What a split run is held to: the fastest cloud-only, and the headline per drafter.

Pure functions on the result's rows (``sim.experiment.runner``). Every split
row's ``ratios`` are against the *fastest* cloud-only of its kind (free shapes,
same core and threads, same run) and its ``ratios_vs_reproducible`` against
cloud-only in canonical shapes (what token identity is checked against; the gap
between the two baselines is the price of reproducibility). A drafter's
headline, per numerics (sessions as the product opens them, and reproducible
ones), is the configuration with the highest median over prompts of its
per-prompt speed-up, with the spread over prompts: not the best of many
configurations on one prompt.
"""

from __future__ import annotations

import statistics

from shared.params import TOKEN_IDENTICAL_MODES

__all__ = ["FASTEST", "REPRODUCIBLE", "baseline_key", "ratios", "headlines", "RATIO_KEYS"]

FASTEST = "fastest"  # cloud-only in free shapes: what a user would run instead
REPRODUCIBLE = "reproducible"  # cloud-only in canonical (batch-invariant) shapes

RATIO_KEYS = ["tokens_per_s", "ttft_s", "up_bytes_per_token", "down_bytes_per_token", "cloud_forwards_per_token",
              "cloud_cpu_s_per_token", "cloud_one_row_step_s"]


def baseline_key(yardstick: str, kind: str, primary_kind: str) -> str:
    """The key of a baseline in ``result["baselines"]``: ``fastest`` / ``reproducible`` for the run's
    primary kind (sampled when any sampled mode ran), ``fastest_greedy`` / ... for the other."""
    return yardstick if kind == primary_kind else f"{yardstick}_{kind}"


def ratios(run: dict, baseline: dict) -> dict:
    """``run``'s figures over ``baseline``'s (None where either has none, or the baseline's is 0)."""
    return {k: (run[k] / baseline[k] if baseline.get(k) and run.get(k) is not None else None) for k in RATIO_KEYS}


def _per_prompt_ratios(run: dict, baseline: dict) -> list[float]:
    return [mine / theirs for mine, theirs in zip(run["per_prompt_tokens_per_s"], baseline["per_prompt_tokens_per_s"])
            if theirs]


def headlines(runs: list[dict], baselines: dict, primary_kind: str) -> dict[str, dict[str, dict]]:
    """Per drafter and numerics ("auto": sessions as the product opens them; "reproducible"): the
    configuration with the highest median per-prompt tokens/s over the fastest cloud-only's (token-identical
    modes when any ran), that median, its spread over prompts and the same against the reproducible
    cloud-only."""
    out: dict[str, dict[str, dict]] = {}
    for drafter in dict.fromkeys(r["drafter"] for r in runs):
        for numerics, reproducible in (("auto", False), ("reproducible", True)):
            mine = [r for r in runs if r["drafter"] == drafter and r["reproducible"] == reproducible]
            mine = [r for r in mine if r["mode"] in TOKEN_IDENTICAL_MODES] or mine
            head = _best(mine, baselines, primary_kind)
            if head is not None:
                out.setdefault(drafter, {})[numerics] = head
    return out


def _best(runs: list[dict], baselines: dict, primary_kind: str) -> dict | None:
    scored = []
    for run in runs:
        kind = "greedy" if run["mode"] == "greedy" else "sampled"
        fastest = _per_prompt_ratios(run, baselines[baseline_key(FASTEST, kind, primary_kind)])
        reproducible = _per_prompt_ratios(run, baselines[baseline_key(REPRODUCIBLE, kind, primary_kind)])
        if fastest:
            scored.append((statistics.median(fastest), fastest, reproducible, run))
    if not scored:
        return None
    median, fastest, reproducible, run = max(scored, key=lambda item: item[0])
    return {
        "config": run["label"],
        "median": median,
        "min": min(fastest),
        "max": max(fastest),
        "median_vs_reproducible": statistics.median(reproducible) if reproducible else None,
        "prompts": len(fastest),
        "runs": 1,
        "identical_to_reproducible": run["identical_to_baseline"],
        "identical_to_fastest": run["identical_to_fastest"],
        "tokens_per_s": run["tokens_per_s"],
    }
