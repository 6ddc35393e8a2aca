"""``splitspec bench gpu-check`` and ``gpu-profiles``: the verifier measured on one GPU, and the profiles made
from it. Flags only; the check is ``sim.bench.gpu_check``, the profiles ``sim.bench.gpu_profiles``.

On a GPU machine without the repo installed, ``scripts/gpu_check.sh`` runs ``python -m sim.cli bench gpu-check``
from the checkout (the command group loads no model code until it runs).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from shared.cli import positive_int
from sim.bench.gpu_plan import SECTIONS

__all__ = ["add"]


def add(subparsers: argparse._SubParsersAction) -> None:
    check = subparsers.add_parser(
        "gpu-check", help="the verifier on one GPU in one command (~2 min on an H200): ceilings, paddings, rows, identity",
        description="Random weights of Llama-3.1-8B's and -70B's shapes made on the device and served by the engine: "
                    "the device's copy bandwidth and matrix rate; which row paddings keep each product's bits; a "
                    "forward by rows (1-1024) and by sessions (1, 8, 32), free and canonical, and the ridge; rows "
                    "alone against beside batch-mates, bit for bit; the 70B shape's 1-, 2- and 4-layer slices; the "
                    "service over loopback gRPC on the tiny target and on the 8B shape, against target-only.",
        epilog="Writes OUT/gpu_check.json after every section (a run killed at its limit keeps what it did); exits 1 "
               "if a section failed or a service session differed from target-only.")
    check.add_argument("--out", type=Path, required=True, help="folder for gpu_check.json")
    check.add_argument("--device", default="cuda", help="torch device (default %(default)s)")
    check.add_argument("--dtype", default=None, choices=("bfloat16", "float16", "float32"),
                       help="default: bfloat16 on an accelerator, float32 on a CPU")
    check.add_argument("--dry-run", action="store_true", help="tiny shapes: the CPU run the test suite makes (seconds)")
    check.add_argument("--budget-s", type=float, default=420.0,
                       help="seconds for every section together, each cut short past its share (default %(default)s)")
    check.add_argument("--repeats", type=positive_int, default=10, help="timed forwards per point (default %(default)s)")
    check.add_argument("--tiny-target", default=None,
                       help="the tiny target's folder (default: generated, which needs the gguf package)")
    check.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="default: all")
    check.set_defaults(func=run_gpu_check)
    profiles = subparsers.add_parser(
        "gpu-profiles", help="hardware profiles for `sim model` from a gpu-check report",
        description="Writes h200-llama8b.toml (measured) and h200-llama70b.toml (extrapolated from the 70B slice) "
                    "from a gpu_check.json; the drafter and acceptance are the assumed profile's.")
    profiles.add_argument("report", type=Path, help="a gpu_check.json with the machine, rows_8b and rows_70b sections")
    profiles.add_argument("out", type=Path, help="folder for the profiles (sim/perf/hardware ships them)")
    profiles.set_defaults(func=run_gpu_profiles)


def run_gpu_check(args: argparse.Namespace) -> int:
    from sim.bench.gpu_check import exit_status, run_gpu_check, summary
    from sim.bench.gpu_plan import GpuCheck

    dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    report = run_gpu_check(GpuCheck(out=args.out, device=args.device, dtype=dtype, dry_run=args.dry_run,
                                    budget_s=args.budget_s, repeats=args.repeats, tiny_target=args.tiny_target,
                                    sections=tuple(args.sections)))
    print(summary(report))
    return exit_status(report)


def run_gpu_profiles(args: argparse.Namespace) -> int:
    from sim.bench.gpu_profiles import write_profiles

    for path in write_profiles(args.report, args.out):
        print(f"wrote {path}")
    return 0
