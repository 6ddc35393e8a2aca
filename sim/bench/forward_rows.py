"""``splitspec bench forward-rows``: what one target forward costs by its row count, in free and
canonical shapes, on the product paths the engine can take.

One sequence with a 300-token prefix; each timed forward appends ``rows`` tokens (reproducible, so
canonical shapes pad it) and is cropped back. Engines, each loaded in turn: free shapes (each product on
the path measured fastest here for its shape and rows, ``cloud.invariance.free_products``: the report's
``free_products`` says which), canonical shapes as the engine picks them (rowdot or oneDNN at its tile
where it holds: the report's ``canonical_paths``), and canonical and free shapes on ``F.linear`` alone
(MKL's tile; the paths before oneDNN). Torch runs on ``threads`` threads, as a cloud pinned to that many cores.

Contract. ``run_forward_rows(...)`` returns the report dict (per engine: its products, paddings,
threads, and per row count the median / min / max ms over ``repeats``); no argparse, no printing
(flags are in ``sim.commands.bench``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["alternated_forward_ms", "run_forward_rows"]

ROWS = (1, 2, 3, 4, 9, 16)


def alternated_forward_ms(engine, arms: dict[str, Callable[[], object]], rows: Sequence[int], repeats: int,
                          reproducible: bool = False) -> Iterator[tuple[int, dict[str, list[float]]]]:
    """Per row count in ``rows``, in order: the milliseconds of each arm's ``repeats`` forwards, each appending
    that many tokens to one sequence of 300 (cropped back after each forward). The arms alternate within a
    row count; ``arms[name]()`` puts the engine in that arm's state before each of its forwards (the
    products' paths, say). ``reproducible``: the forwards' rows ask for canonical shapes."""
    from cloud.engine import ForwardItem

    seq = engine.new_sequence()
    engine.forward(seq, list(range(100, 400)), last_only=True)
    for n in rows:
        times: dict[str, list[float]] = {name: [] for name in arms}
        for _ in range(repeats):
            for name, enter in arms.items():
                enter()
                started = time.perf_counter()
                engine.forward_batch([ForwardItem(seq, [500 + i for i in range(n)], reproducible=reproducible)])
                times[name].append(1e3 * (time.perf_counter() - started))
                engine.crop(seq, 300)
        yield n, times


def run_forward_rows(*, target: str | None = None, rows: tuple[int, ...] = ROWS, repeats: int = 7,
                     threads: int = 1) -> dict[str, Any]:
    """The report (module docstring); ``target`` None is the default Gemma 3 270M."""
    import torch

    import cloud.engine
    from cloud.engine import TargetEngine
    from cloud.models import resolve_target

    torch.set_num_threads(threads)
    path = resolve_target(target)

    def timed(engine) -> dict[str, Any]:
        by_rows = {}
        for n, by_arm in alternated_forward_ms(engine, {"": lambda: None}, rows, repeats, reproducible=True):
            times = by_arm[""]
            by_rows[n] = {"median": round(statistics.median(times), 1), "min": round(min(times), 1),
                          "max": round(max(times), 1)}
        return {"products": engine.products, "canonical_paths": engine.canonical_paths(),
                "free_products": engine.free_products.describe(),
                "padding": repr(engine.padding),
                "attention_padding": repr(engine.attention_padding), "threads": engine.threads, "ms": by_rows}

    report: dict[str, Any] = {"target": str(path), "torch_threads": threads, "repeats": repeats, "engines": {}}
    report["engines"]["free"] = timed(TargetEngine(path, shapes="free"))
    report["engines"]["canonical"] = timed(TargetEngine(path, shapes="canonical"))
    packing = cloud.engine.pack_linears
    cloud.engine.pack_linears = lambda model: 0  # the path before oneDNN: F.linear at MKL's tile
    try:
        report["engines"]["canonical_blas"] = timed(TargetEngine(path, shapes="canonical"))
        report["engines"]["free_blas"] = timed(TargetEngine(path, shapes="free"))
    finally:
        cloud.engine.pack_linears = packing
    return report
