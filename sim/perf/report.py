"""The performance model's predictions for a hardware profile on a scenario, as a report.

Contract. `model_report(hardware, scenario, max_draft_len)` returns a
JSON-ready dict; `format_report(report)` renders it as text. Everything is
labelled MODELLED, not measured (the title, and `"kind": "modelled"`): these
are `sim.perf.model` predictions for the non-pipelined loop, never run
results. No argparse, no printing; the command line is `sim.commands.perf`.
"""

from __future__ import annotations

from typing import Any

from tabulate import tabulate

from shared.params import DEFAULT_WINDOW

__all__ = ["LABEL", "model_report", "format_report"]

LABEL = "MODELLED, not measured"

# (header, alignment) of the prediction table, in column order.
_TABLE_COLUMNS = (
    ("D", "left"),
    ("tok/s", "right"),
    ("x cloud", "right"),
    ("AL", "right"),
    ("cloud ms/tok", "right"),
    ("x cloud", "right"),
    ("up B/tok", "right"),
    ("down B/tok", "right"),
    ("TTFT ms", "right"),
    ("limited by (share of round)", "left"),
)


def model_report(hardware: str, scenario: str, max_draft_len: int = 16, window: int = DEFAULT_WINDOW,
                 slo: float = 15.0) -> dict[str, Any]:
    """The predictions as a JSON-ready dict: ``rows`` lock-step (cloud-only first), ``pipelined_rows``
    with ``window`` blocks in flight, ``capacity`` (sessions per verifier, batched, at ``slo``
    tokens/s per session). ValueError on a bad profile, scenario, D or window."""
    from sim.link.scenario import load_scenario
    from sim.perf.capacity import capacity_at_slo, capacity_rows
    from sim.perf.hardware_profile import load_hardware
    from sim.perf.model import (
        NetworkModel,
        best_draft_len,
        fastest_then_cheapest,
        predict_adaptive,
        predict_cloud_only,
        predict_pipelined,
        predict_split,
    )

    if max_draft_len < 1:
        raise ValueError(f"--max-draft-len must be >= 1, got {max_draft_len}")
    if window < 2:
        raise ValueError(f"--window must be >= 2 (1 is the lock-step table), got {window}")
    profile = load_hardware(hardware)
    scen = load_scenario(scenario)
    timings, link = profile.to_timings(), NetworkModel.from_link_config(scen.link)
    base = predict_cloud_only(timings, link)
    rows = [_row(base, base, "cloud-only")]
    rows += [_row(predict_split(timings, link, d), base, "split") for d in range(1, max_draft_len + 1)]
    best = best_draft_len(timings, link, max_draft_len)
    pipelined_predictions = [predict_pipelined(timings, link, d, window) for d in range(1, max_draft_len + 1)]
    pipelined = [_row(p, base, "pipelined") for p in pipelined_predictions]
    best_pipelined = fastest_then_cheapest(pipelined_predictions).draft_len
    adaptive = _row(predict_adaptive(timings, link, max_draft_len, window), base, "adaptive")
    return {
        "kind": "modelled",
        "label": LABEL,
        "loop": "rows: lock-step (draft D, send, verify D+1, receive, repeat); pipelined_rows: up to `window` "
        "blocks in flight, each chain of blocks running until a correction",
        "hardware": {"name": profile.name, "description": profile.description,
                     "target": profile.target, "drafter": profile.drafter},
        "scenario": {"name": scen.name, "up": scen.link.up.describe(), "down": scen.link.down.describe()},
        "timings": {
            "draft_ms_per_token": profile.draft_ms_per_token,
            "verify_fixed_ms": profile.verify_fixed_ms,
            "verify_per_token_ms": profile.verify_per_token_ms,
            "alpha_per_position": profile.alpha,
            "rebased_per_stale_decode": profile.rebased_per_stale_decode,
            "rebased_verified_per_stale_decode": profile.rebased_verified_per_stale_decode,
            "verify_per_sequence_ms": profile.verify_per_sequence_ms,
            "ridge_rows": profile.ridge_rows,
        },
        "rows": rows,
        "best_draft_len": best,
        "best": next(r for r in rows if r["draft_len"] == best and r["config"] == "split"),
        "window": window,
        "pipelined_rows": pipelined,
        "best_pipelined": next(r for r in pipelined if r["draft_len"] == best_pipelined),
        "adaptive": adaptive,
        "capacity": {"rows": (cap := capacity_rows(profile, link, max_draft_len=max_draft_len, window=window)),
                     "ridge_rows": profile.ridge_rows, **capacity_at_slo(cap, slo)},
    }


def _row(pred, base, config: str) -> dict[str, Any]:
    d = pred.to_dict()
    d["config"] = config
    d["speedup_vs_cloud_only"] = pred.tokens_per_s / base.tokens_per_s
    d["cloud_compute_vs_cloud_only"] = pred.cloud_s_per_token / base.cloud_s_per_token
    d["limit_share"] = pred.breakdown[pred.limit] / pred.round_s if pred.round_s else 0.0
    return d


def _table_cells(row: dict[str, Any]) -> list[str]:
    """One table row, cells in `_TABLE_COLUMNS` order, already formatted."""
    return [
        "0 (cloud-only)" if row["config"] == "cloud-only" else str(row["draft_len"]),
        f"{row['tokens_per_s']:.2f}",
        f"{row['speedup_vs_cloud_only']:.2f}",
        f"{row['acceptance_length']:.2f}",
        f"{row['cloud_s_per_token'] * 1e3:.1f}",
        f"{row['cloud_compute_vs_cloud_only']:.2f}",
        f"{row['up_bytes_per_token']:.1f}",
        f"{row['down_bytes_per_token']:.1f}",
        f"{row['ttft_s'] * 1e3:.0f}",
        f"{row['limit']} ({row['limit_share']:.0%})",
    ]


def format_report(r: dict[str, Any], tablefmt: str = "simple") -> str:
    """The report as text: a header, one table row per D (cloud-only first), the best D.

    `tablefmt` is any tabulate format; "simple" for a terminal, "pipe" for Markdown.
    """
    hw, sc, t = r["hardware"], r["scenario"], r["timings"]
    alpha = ", ".join(f"{a:g}" for a in t["alpha_per_position"])
    table = tabulate(
        [_table_cells(row) for row in r["rows"]],
        headers=[title for title, _ in _TABLE_COLUMNS],
        tablefmt=tablefmt,
        colalign=[align for _, align in _TABLE_COLUMNS],
        disable_numparse=True,  # cells are formatted already: keep "0.50" as written
    )
    b, p, a = r["best"], r["best_pipelined"], r["adaptive"]
    pipelined = tabulate(
        [_table_cells(row) for row in r["pipelined_rows"]],
        headers=[title for title, _ in _TABLE_COLUMNS],
        tablefmt=tablefmt,
        colalign=[align for _, align in _TABLE_COLUMNS],
        disable_numparse=True,
    )
    return "\n".join([
        f"{LABEL}: {hw['name']} on {sc['name']}",
        f"  target : {hw['target']}",
        f"  drafter: {hw['drafter']}",
        f"  link   : up {sc['up']}, down {sc['down']}",
        f"  t_verify(n) = {t['verify_fixed_ms']:g} + {t['verify_per_token_ms']:g}*n ms, "
        f"t_draft = {t['draft_ms_per_token']:g} ms/token, alpha per position = [{alpha}] (last value extends)",
        f"  stale  : a stale block's forward accepts {t['rebased_per_stale_decode']:g} of the {t['rebased_verified_per_stale_decode']:g} "
        "rebased drafts it verifies, on average",
        f"  loop   : {r['loop']}",
        "",
        table,
        "",
        f"best D = {r['best_draft_len']}: {b['tokens_per_s']:.2f} tok/s ({b['speedup_vs_cloud_only']:.2f}x cloud-only), "
        f"cloud compute {b['cloud_compute_vs_cloud_only']:.2f}x cloud-only per token; "
        "round = " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in b["breakdown"].items()),
        "",
        f"pipelined, up to {r['window']} blocks in flight (AL = tokens per verified block, those decoded for stale blocks included; a chain runs until a correction):",
        "",
        pipelined,
        "",
        f"best pipelined D = {p['draft_len']}: {p['tokens_per_s']:.2f} tok/s ({p['speedup_vs_cloud_only']:.2f}x "
        f"cloud-only, {p['tokens_per_s'] / b['tokens_per_s']:.2f}x the best lock-step), cloud compute "
        f"{p['cloud_compute_vs_cloud_only']:.2f}x cloud-only per token",
        f"adaptive (a session's controller, fresh each generation, D <= {r['rows'][-1]['draft_len']} and up to "
        f"{r['window']} blocks in flight or the cloud alone, learning from its first verdicts on): "
        f"{a['tokens_per_s']:.2f} tok/s ({a['speedup_vs_cloud_only']:.2f}x cloud-only, "
        f"{a['tokens_per_s'] / b['tokens_per_s']:.2f}x the best lock-step), cloud compute "
        f"{a['cloud_compute_vs_cloud_only']:.2f}x cloud-only per token, {a['draft_len']} drafts a drafted block on average",
        "",
        _capacity_text(r["capacity"], tablefmt),
        f"({LABEL}: predictions of sim.perf.model; measure with `splitspec sim run` and `splitspec bench capacity`.)",
    ])


def _capacity_text(c: dict[str, Any], tablefmt: str) -> str:
    table = tabulate(
        [[r["sessions"], f"{r['cloud_only_tokens_per_s']:.2f}", f"{r['split_tokens_per_s']:.2f}",
          f"{r['cloud_only_aggregate']:.0f}", f"{r['split_aggregate']:.0f}",
          f"{r['cloud_only_cloud_s_per_token'] * 1e3:.2f}", f"{r['split_cloud_s_per_token'] * 1e3:.2f}",
          r["split_draft_len"] or "alone", r["forward_rows"], f"{r['drafting_tokens_per_s']:.2f}",
          f"{r['drafting_cloud_s_per_token'] * 1e3:.2f}", r["drafting_draft_len"]] for r in c["rows"]],
        headers=["N", "cloud-only tok/s", "split tok/s", "cloud-only agg", "split agg", "cloud-only ms/tok",
                 "split ms/tok", "split D", "rows/fwd", "drafting tok/s", "drafting ms/tok", "drafting D"],
        tablefmt=tablefmt, disable_numparse=True,
    )
    stops = c["split_stops_paying_at"]
    return "\n".join([
        f"capacity, N sessions batched on one verifier (roofline ridge at {c['ridge_rows']:g} rows; per session):",
        "",
        table,
        "",
        "(split: the adaptive schedule, which lets the cloud decode alone where drafting is slower; drafting: "
        "the best D >= 1 kept, for its cloud time per token)",
        f"capacity at {c['slo_tokens_per_s']:g} tok/s per session: split {c['split']} sessions (kept drafting: "
        f"{c['split_drafting']}), cloud-only {c['cloud-only']}; the split stops paying at "
        + (f"N = {stops}" if stops else "no N up to the largest modelled"),
    ])


def format_comparison(reports: list[dict[str, Any]], tablefmt: str = "simple") -> str:
    """One row a profile (each report's): its target's costs, cloud-only, the best pipelined split and the
    adaptive one on the same scenario, and the sessions one verifier carries at the SLO."""
    cells = []
    for r in reports:
        t, base, p, a = r["timings"], r["rows"][0], r["best_pipelined"], r["adaptive"]
        cells.append([r["hardware"]["name"], f"{t['verify_fixed_ms'] + t['verify_per_token_ms']:.1f}",
                      f"{t['verify_fixed_ms'] + 9 * t['verify_per_token_ms']:.1f}", f"{t['ridge_rows']:g}",
                      f"{t['verify_per_sequence_ms']:g}", f"{base['tokens_per_s']:.1f}",
                      f"{p['tokens_per_s']:.1f} ({p['speedup_vs_cloud_only']:.2f}x, D={p['draft_len']})",
                      f"{a['speedup_vs_cloud_only']:.2f}x", f"{p['cloud_compute_vs_cloud_only']:.2f}",
                      f"{r['capacity'].get('split', 0)} / {r['capacity'].get('cloud-only', 0)}"])
    table = tabulate(cells, headers=["profile", "t_verify(1) ms", "t_verify(9) ms", "ridge rows", "+ms a session",
                                     "cloud-only tok/s", "best pipelined tok/s", "adaptive", "cloud compute/token",
                                     "sessions at SLO (split / cloud-only)"], tablefmt=tablefmt, disable_numparse=True)
    scenario = reports[0]["scenario"]["name"]
    return f"{LABEL}: the profiles side by side on {scenario} (each profile's full report follows)\n\n{table}"
