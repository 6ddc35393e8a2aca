"""The umbrella ``splitspec`` command: every face of the product under one name.

Each command group lives beside the code it drives and is imported lazily,
so ``splitspec edge ...`` works on a device with only the edge extra (no
torch, no matplotlib). The sides also have their own entry points,
``splitspec-edge`` (``edge.cli``) and ``splitspec-cloud`` (``cloud.cli``),
with the same subcommands. Exit codes: see ``shared.cli``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from shared.cli import CliError, add_verbosity, run_command

__all__ = ["main", "build_parser"]

# (command, module, function adding its subcommands, help)
_GROUPS = [
    ("generate", "sim.commands.generate", "add_generate_command", None),
    ("edge", "edge.cli", "add_edge_commands", "the client device: run a generation against a cloud verifier"),
    ("cloud", "cloud.cli", "add_cloud_commands", "the verifier service"),
    ("sim", "sim.commands.sim", "add_sim_commands", "network-constrained simulation: link emulator, scenarios, runs"),
    ("models", "sim.commands.models", "add_models_commands", "make models for tests and trials"),
    ("bench", "sim.commands.bench", "add_bench_commands", "benchmarks that print numbers"),
    ("fleet", "sim.commands.fleet", "add_fleet_commands", "MQTT fleet tools: an embedded broker, a live view"),
    ("results", "sim.commands.results", "add_results_commands",
     "the result record: docs/results/baseline.md and the README's figures, generated from the result files"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="splitspec",
        description="Edge-cloud split speculative decoding: a llama.cpp drafter on the device, "
        "a PyTorch verifier in the cloud, output identical to the target model alone.",
    )
    add_verbosity(parser)
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
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
