"""``splitspec bench service``: the verifier's overhead per verify outside the forward. Flags only; the
bench is ``sim.bench.service``.
"""

from __future__ import annotations

import argparse
import json

from shared.cli import non_negative_int, positive_int

__all__ = ["add"]


def add(subparsers: argparse._SubParsersAction) -> None:
    service = subparsers.add_parser(
        "service", help="verifier overhead per verify outside the forward (tiny models by default)",
        description="The same split decoding in process and through a real gRPC server on loopback: the "
                    "servicer's time per verify outside the forward (p50/p90/p99) and the extra per round.")
    service.add_argument("--target", default=None, help="target folder (default: tiny generated models)")
    service.add_argument("--drafter", default=None, help="drafter GGUF matching the target (needed with --target)")
    service.add_argument("--sessions", type=positive_int, default=20,
                         help="sessions, one seed each (default %(default)s)")
    service.add_argument("--mode", choices=("coupled", "rejection"), default="coupled",
                         help="verification mode; rejection also prices the draft audit against a verifier "
                              "without it, interleaved (default %(default)s)")
    service.add_argument("--max-new-tokens", type=positive_int, default=64,
                         help="tokens per session (default %(default)s)")
    service.add_argument("--draft-len", type=non_negative_int, default=4,
                         help="drafted tokens per block D (default %(default)s)")
    service.add_argument("--json", action="store_true", help="print the result as JSON")
    service.set_defaults(func=run_service)


def run_service(args: argparse.Namespace) -> int:
    from sim.bench.service import format_service_report, run_service_bench

    report = run_service_bench(
        target=args.target,
        drafter=args.drafter,
        sessions=args.sessions,
        max_new_tokens=args.max_new_tokens,
        draft_len=args.draft_len,
        mode=args.mode,
    )
    print(json.dumps(report, indent=2) if args.json else format_service_report(report))
    return 0
