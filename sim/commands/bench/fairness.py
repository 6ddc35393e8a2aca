"""``splitspec bench fairness``: honest edges beside attacking clients. Flags only; the bench is
``sim.bench.fairness``.
"""

from __future__ import annotations

import argparse
import json

from shared.cli import non_negative_int, positive_float, positive_int

__all__ = ["add"]


def add(subparsers: argparse._SubParsersAction) -> None:
    fair = subparsers.add_parser(
        "fairness", help="honest edges beside attacking clients: tokens/s, refusals, row shares, RSS (tiny models)",
        description="One in-process verifier on loopback (tiny generated models, CPU): honest edges replaying a real "
                    "drafter's blocks, alone and then beside attacking identities (a process of their own) each running "
                    "every --strategies at once, on the verifier as shipped and on one packing oldest first with no "
                    "cap. Prints (JSON) honest tokens/s both ways and the refusals they met, the attackers' share of "
                    "verify rows in contended forwards against a max-min fair share the bench computes itself, the "
                    "verifier's RSS growth, the largest forward against --max-batch-rows, log records with a "
                    "traceback, and whether honest outputs equal target-only. Exit 1 when they do not.")
    fair.add_argument("--tiny", action="store_true", default=True, help="generated tiny models (the only choice)")
    fair.add_argument("--honest", type=positive_int, default=4, help="honest edges (default %(default)s)")
    fair.add_argument("--attackers", type=non_negative_int, default=2, help="attacking edges (default %(default)s)")
    fair.add_argument("--strategies", nargs="+", default=["garbage"], metavar="NAME",
                      help="what every attacking identity runs at once: garbage, salami, slow_reader, keep_alive, "
                           "flood, made_up, or all (default: %(default)s); sim/bench/attackers.py says what each does")
    fair.add_argument("--streams", type=positive_int, default=8,
                      help="streams each holding strategy (slow_reader, keep_alive, flood) keeps open per identity "
                           "(default %(default)s)")
    fair.add_argument("--max-new-tokens", type=positive_int, default=32,
                      help="tokens per honest edge (default %(default)s)")
    fair.add_argument("--draft-len", type=positive_int, default=4, help="honest block D (default %(default)s)")
    fair.add_argument("--max-draft-len", type=positive_int, default=16,
                      help="the verifier's largest D, the attackers' (default %(default)s)")
    fair.add_argument("--window", type=positive_int, default=4,
                      help="the verifier's blocks in flight, the attackers' window (default %(default)s)")
    fair.add_argument("--rounds", type=positive_int, default=5,
                      help="honest rounds per verifier (alone, as shipped, oldest first); each one's tokens/s is "
                           "their median (default %(default)s)")
    fair.add_argument("--forward-ms", type=positive_float, default=5.0,
                      help="each forward held this long, as a big target's (default %(default)s)")
    fair.add_argument("--row-ms", type=positive_float, default=0.2, help="... plus this per row (default %(default)s)")
    fair.set_defaults(func=run_fairness)


def run_fairness(args: argparse.Namespace) -> int:
    from sim.bench.attackers import STRATEGIES
    from sim.bench.fairness import FairnessBench, run_fairness_bench
    from sim.experiment.provenance import provenance

    made_by = provenance()  # (before the run: a commit made while it runs did not make it)
    report = run_fairness_bench(FairnessBench(
        honest=args.honest, attackers=args.attackers, max_new_tokens=args.max_new_tokens, draft_len=args.draft_len,
        strategies=tuple(STRATEGIES if "all" in args.strategies else args.strategies), streams=args.streams,
        max_draft_len=args.max_draft_len, max_blocks_in_flight=args.window, forward_ms=args.forward_ms,
        row_ms=args.row_ms, rounds=args.rounds))
    report["provenance"] = made_by
    print(json.dumps(report))
    return 0 if report["identical"] else 1
