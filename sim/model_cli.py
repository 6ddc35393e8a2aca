"""`splitspec sim model`: the performance model's predictions for a hardware profile on a scenario.

Contract. `add_model_command(subparsers)` adds `model` and sets
`func=(args) -> int exit code`. Everything printed is labelled MODELLED, not
measured (the table title, and `"kind": "modelled"` in the JSON): these are
`sim.perf_model` predictions for the non-pipelined loop, never run results.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["add_model_command", "model_report"]

LABEL = "MODELLED, not measured"


def add_model_command(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "model", help="predict tokens/s, bytes and cloud work for a hardware profile (modelled, not measured)",
        description="Predict, with the performance model, cloud-only decoding and non-pipelined split "
                    "decoding for D = 1..max on a network scenario. Nothing is run: the numbers are "
                    "MODELLED, not measured.")
    p.add_argument("--hardware", required=True, metavar="NAME|FILE",
                   help="shipped profile (llama70b-8xh100-mac, gemma270m-cpu) or a .toml path")
    p.add_argument("--scenario", default="acespec-50k", metavar="NAME|FILE",
                   help="network scenario name or .toml path (default: acespec-50k)")
    p.add_argument("--max-draft-len", type=int, default=16, metavar="D", help="largest D to model (default 16)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run_model)


def model_report(hardware: str, scenario: str, max_draft_len: int = 16) -> dict[str, Any]:
    """The predictions as a JSON-ready dict; ValueError on a bad profile, scenario or D."""
    from sim.perf_model import LinkModel, best_draft_len, load_hardware, predict_cloud_only, predict_split
    from sim.scenario import load_scenario

    if max_draft_len < 1:
        raise ValueError(f"--max-draft-len must be >= 1, got {max_draft_len}")
    profile = load_hardware(hardware)
    scen = load_scenario(scenario)
    timings, link = profile.to_timings(), LinkModel.from_link_config(scen.link)
    base = predict_cloud_only(timings, link)
    rows = [_row(base, base, "cloud-only")]
    rows += [_row(predict_split(timings, link, d), base, "split") for d in range(1, max_draft_len + 1)]
    best = best_draft_len(timings, link, max_draft_len)
    return {
        "kind": "modelled",
        "label": LABEL,
        "loop": "not pipelined: draft D, send, verify D+1, receive, repeat",
        "hardware": {"name": profile.name, "description": profile.description,
                     "target": profile.target, "drafter": profile.drafter},
        "scenario": {"name": scen.name, "up": scen.link.up.describe(), "down": scen.link.down.describe()},
        "timings": {
            "draft_ms_per_token": profile.draft_ms_per_token,
            "verify_fixed_ms": profile.verify_fixed_ms,
            "verify_per_token_ms": profile.verify_per_token_ms,
            "alpha_per_position": profile.alpha,
        },
        "rows": rows,
        "best_draft_len": best,
        "best": next(r for r in rows if r["draft_len"] == best and r["config"] == "split"),
    }


def _row(pred, base, config: str) -> dict[str, Any]:
    d = pred.to_dict()
    d["config"] = config
    d["speedup_vs_cloud_only"] = pred.tokens_per_s / base.tokens_per_s
    d["cloud_compute_vs_cloud_only"] = pred.cloud_s_per_token / base.cloud_s_per_token
    d["limit_share"] = pred.breakdown[pred.limit] / pred.round_s if pred.round_s else 0.0
    return d


def run_model(args: argparse.Namespace) -> int:
    report = model_report(args.hardware, args.scenario, args.max_draft_len)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_report(report))
    return 0


def format_report(r: dict[str, Any]) -> str:
    hw, sc, t = r["hardware"], r["scenario"], r["timings"]
    alpha = ", ".join(f"{a:g}" for a in t["alpha_per_position"])
    lines = [
        f"{LABEL}: {hw['name']} on {sc['name']}",
        f"  target : {hw['target']}",
        f"  drafter: {hw['drafter']}",
        f"  link   : up {sc['up']}, down {sc['down']}",
        f"  t_verify(n) = {t['verify_fixed_ms']:g} + {t['verify_per_token_ms']:g}*n ms, "
        f"t_draft = {t['draft_ms_per_token']:g} ms/token, alpha per position = [{alpha}] (last value extends)",
        f"  loop   : {r['loop']}",
        "",
    ]
    header = ("D", "tok/s", "x cloud", "AL", "cloud ms/tok", "x cloud", "up B/tok", "down B/tok",
              "TTFT ms", "limited by (share of round)")
    table = [header]
    for row in r["rows"]:
        d = "0 (cloud-only)" if row["config"] == "cloud-only" else str(row["draft_len"])
        table.append((
            d,
            f"{row['tokens_per_s']:.2f}",
            f"{row['speedup_vs_cloud_only']:.2f}",
            f"{row['acceptance_length']:.2f}",
            f"{row['cloud_s_per_token'] * 1e3:.1f}",
            f"{row['cloud_compute_vs_cloud_only']:.2f}",
            f"{row['up_bytes_per_token']:.1f}",
            f"{row['down_bytes_per_token']:.1f}",
            f"{row['ttft_s'] * 1e3:.0f}",
            f"{row['limit']} ({row['limit_share']:.0%})",
        ))
    widths = [max(len(cells[i]) for cells in table) for i in range(len(header))]
    for i, cells in enumerate(table):
        lines.append("  ".join(c.rjust(w) if 0 < j < len(cells) - 1 else c.ljust(w)
                               for j, (c, w) in enumerate(zip(cells, widths))).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    b = r["best"]
    lines += [
        "",
        f"best D = {r['best_draft_len']}: {b['tokens_per_s']:.2f} tok/s ({b['speedup_vs_cloud_only']:.2f}x cloud-only), "
        f"cloud compute {b['cloud_compute_vs_cloud_only']:.2f}x cloud-only per token; "
        "round = " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in b["breakdown"].items()),
        f"({LABEL}: predictions of sim.perf_model; measure with `splitspec sim run`.)",
    ]
    return "\n".join(lines)
