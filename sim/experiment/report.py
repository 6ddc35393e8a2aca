"""Reports of a simulation result: a markdown table, PNG plots, a terminal table."""

from __future__ import annotations

from pathlib import Path

from tabulate import tabulate

from sim.experiment.labels import config_label

__all__ = ["MODEL_TOLERANCE", "markdown_report", "write_plots", "terminal_table"]

MODEL_TOLERANCE = 0.15  # a prediction further off than this from measured is called out in the report

_COLUMNS = [
    ("config", "config"),
    ("tok/s", "tokens_per_s"),
    ("× fastest cloud-only", "ratio_tokens_per_s"),
    ("× reproducible", "reproducible_tokens_per_s"),
    ("ceiling tok/s (eff; per prompt)", "ceiling"),
    ("predicted tok/s (err)", "predicted"),
    ("err out of sample", "prediction_error_out_of_sample"),
    ("TTFT s", "ttft_s"),
    ("AL", "acceptance_length"),
    ("up B/tok", "up_bytes_per_token"),
    ("down B/tok", "down_bytes_per_token"),
    ("fwd/tok", "cloud_forwards_per_token"),
    ("cloud CPU s/tok", "cloud_cpu_s_per_token"),
    ("× fastest CPU", "ratio_cloud_cpu_s_per_token"),
    ("× fastest 1-row step", "ratio_cloud_one_row_step_s"),
    ("identical", "identical_to_baseline"),
]


_DRAFTER_NOTES = {
    "default": "Gemma 3 270M Q4_K_M, the target's own weights: acceptance near its ceiling",
}


def _drafter_note(name: str) -> str:
    if name in _DRAFTER_NOTES:
        return _DRAFTER_NOTES[name]
    return "a requantized rung of the same model, a stand-in for a real smaller drafter" if name.startswith("q") else name


def _label(run: dict) -> str:
    if run.get("label"):
        return run["label"]
    if run["mode"] == "cloud-only":
        return "cloud-only"
    schedule = run.get("schedule") or "lockstep"
    window = run.get("window") or (None if schedule == "adaptive" else 1)  # (None: an adaptive cap the link's)
    return config_label(run["mode"], run["draft_len"], schedule, window, run.get("hedge"))


def _cell(run: dict, key: str) -> str:
    if key == "config":
        return _label(run)
    if key.startswith("ratio_"):
        value = run["ratios"][key.removeprefix("ratio_")]
        return "—" if value is None else f"{value:.2f}×"
    if key.startswith("reproducible_"):
        value = (run.get("ratios_vs_reproducible") or {}).get(key.removeprefix("reproducible_"))
        return "—" if value is None else f"{value:.2f}×"
    if key == "prediction_error_out_of_sample":
        value = run.get(key)
        return "—" if value is None else f"{value:+.0%}"
    if key == "ceiling":
        best, efficiency = run.get("ceiling_tokens_per_s"), run.get("efficiency")
        if not best or efficiency is None:
            return "—"
        each = run.get("per_prompt_efficiency")  # (each prompt against its own ceiling, after its first token)
        return f"{best:.2f} ({efficiency:.0%}" + (f"; per prompt {each['median']:.0%})" if each else ")")
    if key == "predicted":
        err = run.get("prediction_error")
        return f"{run['predicted_tokens_per_s']:.2f} ({err:+.0%})" if err is not None else "—"
    value = run.get(key)
    if key == "identical_to_baseline" and value is None and run.get("identical_to_fastest") is not None:
        return "(yes)" if run["identical_to_fastest"] else "(no)"  # not promised: measured against the fastest
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if key == "cloud_cpu_s_per_token":
        return f"{value:.4f}"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _rows(result: dict) -> list[dict]:
    baselines = result.get("baselines") or {"sampled": result["baseline"]}
    return [*baselines.values(), *result["runs"]]


def _table(result: dict, tablefmt: str) -> str:
    """Baselines then runs, one row each, in any tabulate format; config left, numbers right."""
    return tabulate(
        [[_cell(r, key) for _, key in _COLUMNS] for r in _rows(result)],
        headers=[title for title, _ in _COLUMNS],
        tablefmt=tablefmt,
        colalign=["left"] + ["right"] * (len(_COLUMNS) - 1),
        disable_numparse=True,  # cells are formatted already: keep "1.50×", "n/a", "—" as written
    )


def terminal_table(result: dict) -> str:
    """The results table for a terminal; the same rows as `markdown_report`'s table."""
    return _table(result, "simple")


def _headline(result: dict) -> list[str]:
    base = result["baseline"]
    reproducible = (result.get("baselines") or {}).get("reproducible")
    lines = []
    for drafter, heads in (result.get("headlines") or {}).items():
        for numerics, head in heads.items():
            spread = f"{head['min']:.2f}–{head['max']:.2f}×" if head["prompts"] > 1 else "one prompt"
            versus = (f"; {head['median_vs_reproducible']:.2f}× the reproducible cloud-only"
                      if head.get("median_vs_reproducible") is not None else "")
            lines.append(
                f"- Drafter **{drafter}** ({_drafter_note(drafter)}), "
                f"{'reproducible sessions' if numerics == 'reproducible' else 'sessions as opened by default'}: "
                f"**{head['median']:.2f}×** the fastest cloud-only with {head['config']} (median over "
                f"{head['prompts']} prompt(s) × {head['runs']} run, spread {spread}{versus})."
            )
    if reproducible:
        price = base["tokens_per_s"] / reproducible["tokens_per_s"] if reproducible["tokens_per_s"] else float("nan")
        lines.append(
            f"- The price of reproducibility for a lone session: cloud-only in canonical shapes makes "
            f"{reproducible['tokens_per_s']:.2f} tok/s against {base['tokens_per_s']:.2f} in free shapes "
            f"({price:.2f}× slower)."
        )
    colocated = result.get("colocated") or {}
    if colocated:
        lines.append(
            "- Co-located, the ceiling the link costs against (each drafter beside the target in one process on the "
            "cloud's core, no link, free shapes; not a baseline): "
            + ", ".join(f"{name} {c['tokens_per_s']:.2f} tok/s ({c['ratio_to_fastest']:.2f}× the fastest cloud-only)"
                        for name, c in colocated.items()) + "."
        )
    runs = result["runs"]
    sampled = [r for r in runs if r["mode"] != "greedy"] or runs
    cheapest = min(sampled, key=lambda r: r["cloud_cpu_s_per_token"])
    lines.append(
        f"- Cheapest cloud: **{_label(cheapest)}** at {cheapest['cloud_cpu_s_per_token']:.4f} cloud CPU s/token vs "
        f"{base['cloud_cpu_s_per_token']:.4f} for the fastest cloud-only ({cheapest['ratios']['cloud_cpu_s_per_token']:.2f}×)."
    )
    lines.append(_ttft_line(base, runs))
    promised = [r for r in runs if r["identical_to_baseline"] is not None]
    if promised:
        same = all(r["identical_to_baseline"] for r in promised)
        lines.append(
            "- Token identity of reproducible sessions with reproducible cloud-only decoding (greedy and coupled, "
            f"same seed): **{'yes, every run' if same else 'NO: ' + ', '.join(_label(r) for r in promised if not r['identical_to_baseline'])}**."
        )
    measured = [r for r in runs if r["identical_to_baseline"] is None and r.get("identical_to_fastest") is not None]
    if measured:
        lines.append(
            f"- Sessions that did not ask for reproducibility (exact in distribution; free shapes round differently, "
            f"so identity is measured, not promised): {sum(bool(r['identical_to_fastest']) for r in measured)} of "
            f"{len(measured)} runs token-identical to the fastest cloud-only."
        )
    predicted = [r for r in [*runs, base] if r.get("prediction_error") is not None]
    off = [r for r in predicted if abs(r["prediction_error"]) > MODEL_TOLERANCE]
    lines.append(
        "- Performance model: no predictions (nothing to fit it on: see the model fit)." if not predicted
        else f"- Performance model, in sample: every prediction within {MODEL_TOLERANCE:.0%} of measured."
        if not off
        else f"- Performance model, in sample: off by more than {MODEL_TOLERANCE:.0%} for: "
        + ", ".join(f"{_label(r)} ({r['prediction_error']:+.0%}, limited by {r.get('limited_by', '?')})" for r in off)
        + "."
    )
    outside = [r["prediction_error_out_of_sample"] for r in runs if r.get("prediction_error_out_of_sample") is not None]
    if outside:
        lines.append(
            f"- Performance model, out of sample (fitted on half the prompts, predicting the others): errors "
            f"{min(outside):+.0%} to {max(outside):+.0%} (median {sorted(outside)[len(outside) // 2]:+.0%}) over "
            f"{len(outside)} rows."
        )
    adaptive = [r for r in runs if r.get("predicted_best_tokens_per_s")]
    if adaptive:
        lines.append(
            "- Adaptive runs are predicted as a session runs its controller (learning from the first verdicts on); "
            "the best configuration is predicted at "
            + ", ".join(f"{r['predicted_best_tokens_per_s']:.2f} tok/s for {_label(r)} ({r['predicted_tokens_per_s']:.2f} "
                        "with the controller)" for r in adaptive)
            + "."
        )
    return lines


def _ttft_line(base: dict, runs: list[dict]) -> str:
    """Time to first token, split against cloud-only, and how much of it was the cloud's own time
    (the prefill): on one host the edge's drafting can slow the cloud's prefill, which a real
    deployment, edge and cloud on separate machines, does not see."""

    def span(values: list[float], fmt: str) -> str:
        low, high = min(values), max(values)
        return format(low, fmt) if format(low, fmt) == format(high, fmt) else f"{format(low, fmt)}–{format(high, fmt)}"

    ratios = [r["ratios"]["ttft_s"] for r in runs if r["ratios"]["ttft_s"] is not None]
    line = (f"- Time to first token: split {span(ratios, '.2f')}× the fastest cloud-only's {base['ttft_s']:.3f} s"
            if ratios else f"- Time to first token: cloud-only {base['ttft_s']:.3f} s")
    if runs and base.get("ttft_cloud_s") and all(r.get("ttft_cloud_s") for r in runs):
        line += (f"; of it the cloud's own time (prefill included) was {base['ttft_cloud_s']:.3f} s cloud-only, "
                 f"{span([r['ttft_cloud_s'] for r in runs], '.3f')} s split, and the link and edge's "
                 f"{base['ttft_s'] - base['ttft_cloud_s']:.3f} s cloud-only, "
                 f"{span([r['ttft_s'] - r['ttft_cloud_s'] for r in runs], '.3f')} s split")
    return line + "."


def markdown_report(result: dict) -> str:
    link = result["link"]
    fit = result.get("model_fit") or {}
    return "\n".join(
        [
            f"# splitspec simulation: {result['scenario']}",
            "",
            f"{result.get('description', '')}",
            "",
            f"Link: {link['up_bps'] / 1e3:g} kbit/s up, {link['down_bps'] / 1e3:g} kbit/s down, RTT {link['rtt_ms']:g} ms. "
            f"{len(result['prompts'])} prompt(s), {result['max_new_tokens']} new tokens each, temperature "
            f"{result['temperature']} (greedy runs use 0), seed {result['seed']}.",
            *_provenance_lines(result.get("provenance")),
            "",
            "All numbers below were measured in this run with real processes (edge and cloud pinned to separate cores) "
            "through the emulated link, except the *predicted* columns: the performance model fitted on the same run's "
            "timings, each prompt with its own acceptance (in sample), and fitted on half the prompts predicting the "
            "others (out of sample). Ratios are against the fastest cloud-only (free shapes, same core and threads, "
            "same run); *× reproducible* against cloud-only in canonical shapes, the verifier split runs use. Bytes "
            "are what crossed the emulated TCP link (HTTP/2 and gRPC framing and the session's setup included).",
            "",
            *_headline(result),
            "",
            _table(result, "pipe"),
            "",
            *_hedge_lines(result),
            *_stale_lines(result),
            *_fit_lines(fit),
            *_fleet_lines(result.get("fleet")),
        ]
    )


def _provenance_lines(provenance: dict | None) -> list[str]:
    if not provenance:
        return []
    return ["", f"Made by `{provenance['command']}` at commit {provenance['commit'] or 'unknown'} on "
                f"{provenance['date']}, {provenance['machine']}."]


def _fit_lines(fit: dict) -> list[str]:
    """The model's fitted timings, per numerics (canonical forwards cost more than free ones)."""
    lines = []
    for numerics, described in fit.items():
        lines += [f"## Model fit ({numerics} sessions)", "",
                  *[f"- {k} ({numerics} sessions): {v}" for k, v in described.items()], ""]
    return lines


def _hedge_lines(result: dict) -> list[str]:
    """h per run: how often a correction was the drafter's second choice, the bet a hedge branch makes."""
    rows = [[_label(r),
             f"{r['hedge_hit_rate']:.2f}",
             f"{r['hedges_taken']}/{r['hedges_sent']}" if r.get("hedges_sent") else "-",
             f"{r['hedge_tokens']}" if r.get("hedges_sent") else "-"]
            for r in result["runs"] if r.get("hedge_hit_rate") is not None]
    if not rows:
        return []
    return ["## Corrections the drafter saw coming", "",
            "h: the share of corrections that were the drafter's second choice (the runner-up of its race under "
            "the target's noise; greedy: its second-highest logit). A hedge branch for that token pays off this "
            "often; with `--hedges`, the branches taken and the tokens they committed past their correction.", "",
            tabulate(rows, headers=["config", "h", "hedges taken", "tokens gained"], tablefmt="pipe"), ""]


def _stale_lines(result: dict) -> list[str]:
    """Per run: the blocks answered stale, the forwards the cloud ran for them meanwhile, and the rebased
    drafts those verified and accepted (tokens per such forward: 1 + accepted / forwards); and the drafts
    the cloud proposed itself while decoding alone, accepted and verified."""
    rows = [[_label(r),
             r["stale_blocks"], r["stale_decoded"], f"{r['rebased_accepted']}/{r['rebased_verified']}",
             f"{1 + r['rebased_accepted'] / r['stale_decoded']:.2f}" if r["stale_decoded"] else "-",
             f"{r.get('proposed_accepted', 0)}/{r.get('proposed', 0)}"]
            for r in result["runs"] if r.get("stale_blocks") or r.get("proposed")]
    if not rows:
        return []
    return ["## Stale blocks", "",
            "Blocks in flight past a correction come back stale. While the next chain's first block is on its way "
            "the cloud runs a forward for each (none when a usable block already waits): the next token, after "
            "the drafts sent for those positions that it verifies where they lie and accepts (rebased; greedy "
            "and coupled modes). While the cloud decodes alone, it verifies drafts it proposes itself (prompt "
            "lookup over the committed tokens) in rows its forward holds anyway (none in free shapes on a CPU).", "",
            tabulate(rows, headers=["config", "stale", "forwards", "rebased accepted/verified", "tokens per forward",
                                    "cloud's proposals accepted/verified"],
                     tablefmt="pipe"), ""]


def _fleet_lines(fleet: dict | None) -> list[str]:
    """The fleet as the broker saw it at the end of the run, and what MQTT cost the uplink."""
    if not fleet:
        return []
    share = fleet["mqtt_uplink_share"]
    lines = ["## Fleet (MQTT)", "",
             f"- fleet: MQTT crossed the same emulated link: {fleet['mqtt_up_bytes']} B up, {fleet['mqtt_down_bytes']} B "
             f"down over {fleet['split_runs_s']:.0f} s of split runs"
             + (f" ({share:.2%} of the uplink; each edge process connects anew, a device keeps one connection)"
                if share is not None else "")]
    for name, docs in sorted(fleet["view"]["clouds"].items()):
        load = docs.get("load", {})
        lines.append(f"- fleet: cloud {name} {docs.get('status', {}).get('state', '?')}: {load.get('sessions')} sessions, "
                     f"{load.get('free_slots')} free slots, verify p50 {load.get('verify_latency_p50_s')} s, "
                     f"suggested D {load.get('suggested_max_draft_len')}")
    for name, docs in sorted(fleet["view"]["edges"].items()):
        tele = docs.get("telemetry", {})
        alpha = " ".join(f"{a:.2f}" for a in tele.get("alpha_at", []))
        lines.append(f"- fleet: edge {name} {docs.get('status', {}).get('state', '?')}: last telemetry "
                     f"{tele.get('tokens_per_s')} tok/s, {tele.get('mode')} D={tele.get('D')} W={tele.get('W')}, "
                     f"α by position [{alpha}], RTT {tele.get('rtt_ms')} ms")
    return [*lines, ""]


def write_plots(result: dict, out_dir: Path) -> list[Path]:
    """One PNG per metric, bars per configuration with cloud-only first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _rows(result)
    labels = [_label(r) for r in rows]
    metrics = [
        ("tokens_per_s", "edge tokens/s (measured; ◆ predicted)", "tokens_per_s.png"),
        ("acceptance_length", "acceptance length (tokens per round)", "acceptance_length.png"),
        ("up_bytes_per_token", "uplink bytes per generated token", "uplink_bytes_per_token.png"),
        ("cloud_cpu_s_per_token", "cloud CPU seconds per generated token", "cloud_compute_per_token.png"),
    ]
    paths = []
    for key, title, name in metrics:
        fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(rows)), 4))
        colors = ["#888888" if r["mode"] == "cloud-only" else {"greedy": "#1f77b4", "coupled": "#2ca02c", "rejection": "#d62728"}.get(r["mode"], "#9467bd") for r in rows]
        ax.bar(range(len(rows)), [r[key] for r in rows], color=colors)
        if key == "tokens_per_s":
            ax.scatter(range(len(rows)), [r.get("predicted_tokens_per_s") or float("nan") for r in rows], marker="D", color="black", zorder=3)
        ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right")
        ax.set_title(f"{result['scenario']}: {title}")
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        path = out_dir / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
