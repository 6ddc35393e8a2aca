"""``splitspec bench …`` subcommands, one module each: ``wire``, ``split``, ``service``, ``fuzz``, ``serve``,
``capacity``, ``invariance``, ``fairness``, ``products``, ``categories`` (and ``forward-rows``), ``gpu``
(``gpu-check``, ``gpu-profiles``).

Flags only: each module's ``add`` declares its flags beside the run that turns them into the arguments of
the matching ``sim.bench`` function and prints the result (text or JSON). The benches' heavy imports happen
when a subcommand runs, so ``--help`` loads no model code. Sampling defaults are the product's, from
``shared.params``.
"""

from __future__ import annotations

import argparse

from sim.commands.bench import (
    capacity,
    categories,
    fairness,
    fuzz,
    gpu,
    invariance,
    products,
    serve,
    service,
    split,
    wire,
)

__all__ = ["add_bench_commands"]


def add_bench_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add the bench subcommands to a ``bench`` subparsers object."""
    for bench in (wire, split, service, fuzz, serve, capacity, invariance, fairness, products, categories, gpu):
        bench.add(subparsers)
