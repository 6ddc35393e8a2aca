"""``splitspec bench fuzz``: a real verifier soaked with hostile frames. Flags only; the bench is ``sim.bench.fuzz``."""

from __future__ import annotations

import argparse
import json

from shared.cli import positive_int

__all__ = ["add"]


def add(subparsers: argparse._SubParsersAction) -> None:
    fuzz = subparsers.add_parser(
        "fuzz", help="soak a real verifier with hostile frames while an honest edge decodes (tiny models)",
        description="Starts `splitspec-cloud serve` on tiny generated models and sends at least --frames hostile "
                    "messages on concurrent streams from several client identities: random bytes, mutated valid "
                    "frames, out-of-range ids, positions and epochs, zstd bombs, oversized payloads and messages, "
                    "streams abandoned or left silent. An honest edge decodes all the while and must stay "
                    "token-identical. Reports how streams ended, hangs, the service's memory, the longest an "
                    "honest Open was refused and the sessions left once the TTL passed; exits 1 on any finding.")
    fuzz.add_argument("--frames", type=positive_int, default=10_000, help="hostile messages (default %(default)s)")
    fuzz.add_argument("--workers", type=positive_int, default=8, help="concurrent hostile streams (default %(default)s)")
    fuzz.add_argument("--seed", type=int, default=0)
    fuzz.add_argument("--json", action="store_true", help="print the report as JSON")
    fuzz.set_defaults(func=run_fuzz)


def run_fuzz(args: argparse.Namespace) -> int:
    import sys

    from sim.bench.fuzz import soak_tiny_service

    report = soak_tiny_service(args.frames, seed=args.seed, workers=args.workers,
                               progress=lambda line: print(line, file=sys.stderr, flush=True))
    result = report.to_json()
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>18}: {value}")
    clean = (not report.unexpected and not report.hangs and not report.honest_errors and report.server_alive
             and report.honest_identical == report.honest_sessions and report.sessions_left == 0
             and report.forged_accepted == 0)
    return 0 if clean else 1
