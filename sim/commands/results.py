"""``splitspec results …``: the result record under ``docs/results/``. Flags only; the work is
``sim.experiment.baseline``'s.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from shared.cli import CliError

__all__ = ["add_results_commands"]

CHECKOUT = Path(__file__).resolve().parents[2]  # the checkout this package runs from


def add_results_commands(commands: argparse._SubParsersAction) -> None:
    """Add ``baseline`` to the ``results`` subparsers object."""
    baseline = commands.add_parser(
        "baseline", help="regenerate docs/results/baseline.md and the README's Results tables from the result files",
        description="Read every result file in docs/results/<date>-<question>/, compute the figures the README "
                    "quotes, write docs/results/baseline.md (each figure with its machine, commit and files; each "
                    "file with its command) and rewrite the README's region between <!-- baseline:begin --> and "
                    "<!-- baseline:end --> from it. Idempotent. With --check, write nothing and exit 1 when either "
                    "file is out of date or a Markdown link into docs/results/ names nothing.")
    baseline.add_argument("--check", action="store_true",
                          help="only check: exit 1 naming what is out of date or dangling")
    baseline.add_argument("--root", type=Path, default=CHECKOUT,
                          help="the checkout holding README.md and docs/results/ (default: %(default)s)")
    baseline.set_defaults(func=run_baseline)


def run_baseline(args: argparse.Namespace) -> int:
    from sim.experiment.baseline import dangling_result_links, refresh

    if not (args.root / "README.md").is_file():
        raise CliError(f"--root {args.root}: no README.md there", 2)
    stale = refresh(args.root, check=args.check)
    dangling = dangling_result_links(args.root)
    problems = []
    if stale and args.check:
        problems.append(f"out of date with the result files: {', '.join(stale)}; run `splitspec results baseline` "
                        "(a figure is changed in its result file, never by hand)")
    if dangling:
        problems.append("links into docs/results/ that name nothing: "
                        + "; ".join(f"{where} -> {target}" for where, target in dangling))
    if problems:
        raise CliError(". ".join(problems), 1)
    print(("rewrote " + ", ".join(stale)) if stale else "baseline.md and the README's results are up to date")
    return 0
