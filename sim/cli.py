"""The ``splitspec`` command: one entry point for every face of the product.

Each command group lives beside the code it drives and is imported lazily,
so ``splitspec edge ...`` works on a device with only the edge extra (no
torch, no matplotlib). Bad input exits 2 with a one-line error.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from shared.errors import CliError

__all__ = ["main", "build_parser"]

# (command, module, function adding its subcommands, help)
_GROUPS = [
    ("generate", "sim.generate_cli", "add_generate_command", None),
    ("edge", "edge.cli", "add_edge_commands", "the client device: run a generation against a cloud verifier"),
    ("cloud", "cloud.cli", "add_cloud_commands", "the verifier service"),
    ("sim", "sim.sim_cli", "add_sim_commands", "network-constrained simulation: link emulator, scenarios, runs"),
    ("models", "sim.models_cli", "add_models_commands", "make models for tests and trials"),
    ("bench", "sim.bench_cli", "add_bench_commands", "benchmarks that print numbers"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="splitspec",
        description="Edge-cloud split speculative decoding: a llama.cpp drafter on the device, "
        "a PyTorch verifier in the cloud, output identical to the target model alone.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module, function, help_text in _GROUPS:
        try:
            add = getattr(importlib.import_module(module), function)
        except ImportError as exc:  # a group whose extra is not installed
            missing = commands.add_parser(name, help=f"(unavailable: {exc.name} is not installed)")
            missing.set_defaults(func=lambda args, exc=exc: _unavailable(exc))
            continue
        if help_text is None:
            add(commands)
        else:
            group = commands.add_parser(name, help=help_text, description=help_text)
            add(group.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True))
    return parser


def _unavailable(exc: ImportError) -> int:
    raise CliError(f"this command needs {exc.name}; install the matching extra, e.g. pip install 'splitspec[sim]'", 2)


def main(argv: list[str] | None = None) -> int:
    # torch's OpenMP workers spin between ops by default, starving a llama.cpp
    # drafter in the same process (measured: 6x slower split decoding).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    args = build_parser().parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"splitspec: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except (FileNotFoundError, ValueError) as exc:
        print(f"splitspec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("splitspec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
