"""``splitspec bench invariance``: bit-identical rows alone, in a block, beside batch-mates. Flags
only; the bench is ``sim.bench.invariance``.
"""

from __future__ import annotations

import argparse
import json

from shared.cli import positive_int

__all__ = ["add"]


def add(subparsers: argparse._SubParsersAction) -> None:
    check = subparsers.add_parser(
        "invariance", help="are a row's logits bit-identical alone, in a block and beside batch-mates?",
        description="Runs random token sequences through the target engine twice: one token per forward (as "
                    "target-only decoding does) and in random blocks, chunked prefills and crops, every forward "
                    "shared with batch-mates. Reports whether every row's logits were bit-identical (torch.equal) "
                    "and the largest difference; exits 1 when canonical shapes were not bit-identical.")
    check.add_argument("--target", default=None, help="target folder or GGUF (default: Gemma 3 270M)")
    check.add_argument("--tiny", action="store_true", help="generated tiny target")
    check.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    check.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                       help="default: float32 on CPU, bfloat16 on GPU")
    check.add_argument("--shapes", choices=("canonical", "free"), default="canonical")
    check.add_argument("--trials", type=positive_int, default=5, help="random sequences (default %(default)s)")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.set_defaults(func=run_invariance)


def run_invariance(args: argparse.Namespace) -> int:
    from sim.bench.invariance import run_invariance_check

    report = run_invariance_check(target=args.target, tiny=args.tiny, device=args.device, dtype=args.dtype,
                                  trials=args.trials, canonical=args.shapes == "canonical")
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:>22}: {value}")
    return 0 if report["bit_identical"] or args.shapes == "free" else 1
