"""``splitspec bench split``: split decoding against cloud-only, in one process. Flags only; the bench
is ``sim.bench.split``.
"""

from __future__ import annotations

import argparse
import json

from shared.cli import positive_int
from sim.bench.split import DEFAULT_PROMPT as SPLIT_PROMPT  # a constant; the bench itself loads lazily
from sim.commands.bench.common import MODES, add_logit_processing

__all__ = ["add"]


def add(subparsers: argparse._SubParsersAction) -> None:
    split = subparsers.add_parser(
        "split", help="split decoding vs cloud-only, in one process, on real models",
        description="For each mode and draft length, the same prompt and seed in one process: acceptance, "
                    "target forwards per token, wall time against cloud-only (D=0) in free shapes (the fastest) "
                    "and in canonical shapes (the reproducible, which the split runs in), both on the same torch "
                    "threads, drafter overhead, token identity with the reproducible cloud-only.")
    split.add_argument("--target", default=None, help="target folder or GGUF (default: Gemma 3 270M)")
    split.add_argument("--drafter", default=None, help="drafter GGUF (default: Gemma 3 270M Q4_K_M)")
    split.add_argument("--prompt", default=SPLIT_PROMPT, help="text to continue (default: a short-story prompt)")
    split.add_argument("--max-new-tokens", type=positive_int, default=128,
                       help="tokens per run (default %(default)s)")
    split.add_argument("--modes", nargs="+", choices=MODES, default=MODES)
    split.add_argument("--draft-lens", nargs="+", type=positive_int, default=[4, 8],
                       help="draft lengths D besides the D=0 baseline (default 4 8)")
    add_logit_processing(split, "coupled and rejection (greedy uses temperature 0): ")
    split.add_argument("--seed", type=int, default=0)
    split.add_argument("--lookup", action="store_true",
                       help="each split run again with the drafter behind prompt lookup (edge --lookup)")
    split.add_argument("--json", action="store_true", help="print the result as JSON")
    split.set_defaults(func=run_split)


def run_split(args: argparse.Namespace) -> int:
    from sim.bench.split import SplitBench, format_split_row, format_split_yardstick, run_split_bench

    def show(row: dict) -> None:
        print(format_split_row(row), flush=True)

    result = run_split_bench(SplitBench(
        target=args.target, drafter=args.drafter, prompt=args.prompt, max_new_tokens=args.max_new_tokens,
        modes=args.modes, draft_lens=args.draft_lens, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, seed=args.seed, lookup=args.lookup), on_row=None if args.json else show)
    print(json.dumps(result, indent=2) if args.json else format_split_yardstick(result))
    return 0
