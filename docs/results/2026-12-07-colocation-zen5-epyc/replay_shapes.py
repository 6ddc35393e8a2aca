"""The engine's one-row forward alone, and between the split's other shapes, with no edge running.

Usage (from the repository root, the venv's python):
    python docs/results/2026-12-07-colocation-zen5-epyc/replay_shapes.py

Pinned to the cloud's core of ``core_split``, one torch thread, the default target as the cloud loads it
(``--shapes auto``): after a 225-token prefill, the median of 60 one-row forwards run alone, after a 9-row
forward cropped back to its first row (as a block's verification is, then two one-row steps), and after a
5-row one; three rounds. Whether the split's pattern of shapes, rather than its neighbour, slows a one-row
forward.
"""
import os
import statistics
import time

from sim.experiment.processes import core_split

_, CLOUD = core_split()
os.sched_setaffinity(0, CLOUD)
os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402  (after the thread count is set)

from cloud.engine import TargetEngine  # noqa: E402
from cloud.models import resolve_target  # noqa: E402


def one_row_ms(engine: TargetEngine, pattern: list[int], forwards: int = 60) -> float:
    """The median one-row forward of ``forwards``, run in the repeating ``pattern`` of row counts."""
    seq = engine.new_sequence()
    engine.forward(seq, list(range(100, 325)), last_only=True)
    times, token = [], 1000
    while len(times) < forwards:
        for rows in pattern:
            if rows == 1:
                started = time.perf_counter()
                engine.forward(seq, [token])
                times.append((time.perf_counter() - started) * 1e3)
            else:
                engine.forward(seq, [token + j for j in range(rows)])
                engine.crop(seq, seq.length - rows + 1)
            token += 1
    return statistics.median(times)


def main() -> None:
    torch.set_num_threads(1)
    engine = TargetEngine(resolve_target(None), shapes="auto")
    one_row_ms(engine, [1], 10)  # warm
    for _ in range(3):
        print(f"alone {one_row_ms(engine, [1]):.1f}  after-9-rows {one_row_ms(engine, [9, 1, 1]):.1f}  "
              f"after-5-rows {one_row_ms(engine, [5, 1]):.1f}  alone {one_row_ms(engine, [1]):.1f}", flush=True)


if __name__ == "__main__":
    main()
