"""`splitspec sim model`: the performance model's predictions for a hardware profile on a scenario.

Contract. `add_model_command(subparsers)` adds `model` and sets
`func=(args) -> int exit code`. Flags only; the report is `sim.perf.report`
(labelled MODELLED, not measured).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from shared.params import DEFAULT_WINDOW

__all__ = ["add_model_command"]


def add_model_command(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "model", help="predict tokens/s, bytes and cloud work for a hardware profile (modelled, not measured)",
        description="Predict, with the performance model, cloud-only decoding and split decoding, lock-step "
                    "and pipelined (--window blocks in flight), for D = 1..max on a network scenario. Nothing is run: the numbers are "
                    "MODELLED, not measured.")
    p.add_argument("--hardware", required=True, nargs="+", metavar="NAME|FILE",
                   help="shipped profile (llama70b-8xh100-mac, the assumed one; h200-llama8b and h200-llama70b, "
                        "from the H200 check; gemma270m-cpu) or a .toml path; several: a row each side by side "
                        "first, then each one's report")
    p.add_argument("--scenario", default="acespec-50k", metavar="NAME|FILE",
                   help="network scenario name or .toml path (default: acespec-50k)")
    p.add_argument("--max-draft-len", type=int, default=16, metavar="D", help="largest D to model (default 16)")
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW, metavar="W",
                   help=f"blocks in flight for the pipelined table (default {DEFAULT_WINDOW})")
    p.add_argument("--slo", type=float, default=15.0, metavar="TOK_S",
                   help="tokens/s per session for the capacity table's capacity (default 15)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run_model)


def run_model(args: argparse.Namespace) -> int:
    from sim.perf.report import format_comparison, format_report, model_report

    reports = [model_report(hardware, args.scenario, args.max_draft_len, args.window, args.slo)
               for hardware in args.hardware]
    if args.json:
        print(json.dumps(reports[0] if len(reports) == 1 else reports, indent=2))
    else:
        texts = [format_report(report) for report in reports]
        print("\n\n".join([format_comparison(reports), *texts] if len(reports) > 1 else texts))
    return 0
