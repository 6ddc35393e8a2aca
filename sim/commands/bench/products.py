"""``splitspec bench products``: product paths and a forward's cost by rows. Flags only; the bench is
``sim.bench.products``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from shared.cli import positive_int
from sim.commands.bench.common import write_json

__all__ = ["add"]


def add(subparsers: argparse._SubParsersAction) -> None:
    products = subparsers.add_parser(
        "products", help="which matrix-product path keeps a row's bits at the smallest row tile (CPU, minutes)",
        description="Probe ways to compute x @ W.T on Gemma 3 270M's shapes (MKL GEMM in either operand order, "
                    "oneDNN's inner product, row-wise GEMV) under MKL/oneDNN settings, each in a subprocess: the "
                    "smallest row tile at which each is bit-invariant, and its time by row count.")
    products.add_argument("--repeats", type=positive_int, default=5, help="timed repeats (default %(default)s)")
    products.add_argument("--out", type=Path, default=None, help="write the JSON report here (else stdout)")
    products.set_defaults(func=run_products)
    rows = subparsers.add_parser(
        "forward-rows", help="one target forward's cost by row count: free and canonical, as chosen and on BLAS alone",
        description="Time forwards of 1-16 appended rows on the target in free shapes (each product on the path "
                    "the engine measured fastest here for its row count: the report's free_products says which and "
                    "why), canonical shapes as the engine picks them (oneDNN where it holds), and both on F.linear "
                    "alone.")
    rows.add_argument("--target", default=None, help="target folder or GGUF (default: Gemma 3 270M)")
    rows.add_argument("--threads", type=positive_int, default=1,
                      help="torch threads (default %(default)s: one core, as sim run gives the cloud)")
    rows.add_argument("--repeats", type=positive_int, default=7, help="timed repeats (default %(default)s)")
    rows.add_argument("--out", type=Path, default=None, help="write the JSON report here (else stdout)")
    rows.set_defaults(func=run_forward_rows)


def run_products(args: argparse.Namespace) -> int:
    from sim.bench.products import run_product_probe

    return write_json(run_product_probe(repeats=args.repeats), args.out)


def run_forward_rows(args: argparse.Namespace) -> int:
    from sim.bench.forward_rows import run_forward_rows as measure

    return write_json(measure(target=args.target, threads=args.threads, repeats=args.repeats), args.out)
