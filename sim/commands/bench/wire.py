"""``splitspec bench wire``: uplink bytes per drafted token against the floor. Flags only; the bench is
``sim.bench.wire``.
"""

from __future__ import annotations

import argparse
import json

from shared.cli import positive_int
from shared.params import DEFAULT_DRAFT_LEN, DEFAULT_DRAFT_TOP_K, DEFAULT_PROB_BITS
from sim.commands.bench.common import add_logit_processing

__all__ = ["add"]


def add(subparsers: argparse._SubParsersAction) -> None:
    wire = subparsers.add_parser(
        "wire",
        help="uplink bytes per drafted token for each mode vs the floor and a naive protobuf",
        description="Encode synthetic draft blocks and count the bytes that cross the link.",
    )
    wire.add_argument("--vocab", type=positive_int, default=262144, help="vocabulary size V (default %(default)s)")
    wire.add_argument("--draft-len", type=positive_int, default=DEFAULT_DRAFT_LEN,
                      help="drafted tokens per block D (default %(default)s)")
    wire.add_argument("--draft-top-k", type=positive_int, default=DEFAULT_DRAFT_TOP_K,
                      help="max support of q̃, rejection (default %(default)s)")
    wire.add_argument("--prob-bits", type=positive_int, default=DEFAULT_PROB_BITS,
                      help="q̃ weights sum to 2**B, rejection (default %(default)s)")
    wire.add_argument("--blocks", type=positive_int, default=200, help="blocks to encode (default %(default)s)")
    wire.add_argument("--seed", type=int, default=0)
    wire.add_argument("--drafter", default=None,
                      help="take q from this GGUF drafter (or 'default' for Gemma 3 270M) instead of synthetic Zipf blocks")
    add_logit_processing(wire, "with --drafter: ")
    wire.add_argument("--json", action="store_true", help="print the result as JSON")
    wire.set_defaults(func=run_wire)


def run_wire(args: argparse.Namespace) -> int:
    from sim.bench.wire import format_wire_report, recorded_drafter, run_wire_bench

    vocab_size, drafter = args.vocab, None
    if args.drafter is not None:
        vocab_size, drafter = recorded_drafter(
            args.drafter, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    result = run_wire_bench(
        drafter=drafter,
        vocab_size=vocab_size,
        draft_len=args.draft_len,
        draft_top_k=args.draft_top_k,
        prob_bits=args.prob_bits,
        blocks=args.blocks,
        seed=args.seed,
    )
    print(json.dumps(result, indent=2) if args.json else format_wire_report(result))
    return 0
