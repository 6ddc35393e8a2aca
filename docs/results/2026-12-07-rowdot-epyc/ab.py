"""Free-shape forwards of Gemma 3 270M by appended rows, the engine's per-shape choice of product path with
and without ``rowdot`` among the paths (the choice without it: the same measurement, rowdot's column set
to never faster). Alternated in one process, one torch thread, a 300-token context: the median of 9 each.
Writes the JSON report to the path given (default /tmp/ab.json)."""

import json
import math
import statistics
import sys

import torch

from cloud.engine import TargetEngine
from cloud.invariance.free_products import PATHS, ROWDOT, FreeProducts, _choice
from cloud.invariance.products import PackedLinear
from cloud.models import resolve_target
from sim.bench.forward_rows import alternated_forward_ms
from sim.experiment.provenance import provenance

made = {**provenance(), "command": " ".join(["python", *sys.argv])}
torch.set_num_threads(1)
engine = TargetEngine(resolve_target(None), shapes="free")
packed = [m for m in engine.model.modules() if isinstance(m, PackedLinear)]
measured = engine.free_products
column = PATHS.index(ROWDOT)
without_ms = {s: {r: tuple(math.inf if i == column else t for i, t in enumerate(ts)) for r, ts in by.items()}
              for s, by in measured.ms.items()}
without = FreeProducts({s: _choice(by) for s, by in without_ms.items()}, without_ms, "measured, rowdot left out")
choices = {"three paths": without, "with rowdot": measured}
for name, choice in choices.items():
    print(f"{name}: {choice.describe()}")


def enter(choice: FreeProducts) -> None:
    for module in packed:
        module.free = choice


out = {}
entering = {name: (lambda arm=arm: enter(arm)) for name, arm in choices.items()}
for rows, times in alternated_forward_ms(engine, entering, (1, 2, 3, 4, 6, 9, 12, 16), 9):
    out[rows] = {name: round(statistics.median(values), 1) for name, values in times.items()}
    print(rows, out[rows], flush=True)
with open(sys.argv[1] if len(sys.argv) > 1 else "/tmp/ab.json", "w") as file:
    json.dump({"provenance": made, "threads": 1, "choices": {n: c.describe() for n, c in choices.items()},
               "measured_ms": {f"{s[0]}x{s[1]}": {r: dict(zip(PATHS, t)) for r, t in by.items()}
                               for s, by in measured.ms.items()},
               "forward_ms_median_of_9": out}, file, indent=1)
