"""``splitspec bench serve``: edge serve: a conversation's uplink and TTFT, the HTTP overhead. Flags
only; the bench is ``sim.bench.serve``.
"""

from __future__ import annotations

import argparse
import json

from shared.cli import positive_int
from shared.params import DEFAULT_SCHEDULE, SCHEDULES

__all__ = ["add"]


def add(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser(
        "serve", help="edge serve: conversation uplink and TTFT (kept vs fresh session), HTTP overhead",
        description="With a real cloud process behind the emulated link: a conversation of --turns turns kept in "
                    "one cloud session against a fresh session per turn (prompt tokens and bytes uploaded, time to "
                    "first token, identical replies), then one prompt streamed through the OpenAI server against "
                    "the same generation called directly, then edge serve under --concurrency concurrent conversations, then "
                    "that prompt cloud-only through the same link from "
                    "a cloud in free shapes (the fastest) and from the split's own (canonical) on the same cores: "
                    "the direct split's tokens/s over each.")
    serve.add_argument("--scenario", default="acespec-50k", help="link scenario (default %(default)s)")
    serve.add_argument("--turns", type=positive_int, default=10, help="user turns, at most 10 (default %(default)s)")
    serve.add_argument("--max-tokens", type=positive_int, default=32, help="reply tokens per turn (default %(default)s)")
    serve.add_argument("--repeats", type=positive_int, default=3, help="HTTP vs direct repeats (default %(default)s)")
    serve.add_argument("--target", default=None, help="target folder or GGUF (default: Gemma 3 270M)")
    serve.add_argument("--drafter", default=None, help="drafter GGUF (default: Gemma 3 270M Q4_K_M)")
    serve.add_argument("--lookup", action=argparse.BooleanOptionalAction, default=True,
                       help="the drafter behind prompt lookup, as `edge serve` runs it by default (--no-lookup: the "
                            "GGUF drafter alone; run both to see what lookup buys a conversation)")
    serve.add_argument("--schedule", choices=SCHEDULES, default=DEFAULT_SCHEDULE,
                       help="edge serve's --schedule (default %(default)s)")
    serve.add_argument("--concurrency", type=positive_int, nargs="*", default=[1, 2, 4, 8],
                       help="then edge serve under this many concurrent two-turn conversations, one level each, "
                            "at most 8 (default: 1 2 4 8; none: skip): tok/s together, TTFT and latency")
    serve.add_argument("--json", action="store_true", help="print the result as JSON")
    serve.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    import sys

    from sim.bench.serve import ServeBench, format_serve_report, run_serve_bench

    report = run_serve_bench(ServeBench(
        scenario=args.scenario, turns=args.turns, max_tokens=args.max_tokens, repeats=args.repeats,
        target=args.target, drafter=args.drafter, lookup=args.lookup, schedule=args.schedule,
        concurrency=tuple(args.concurrency)),
        progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps(report) if args.json else format_serve_report(report))
    return 0
