"""Free-shape forwards of Gemma 3 270M by appended rows, on three choices of product path: the prior rule
(``F.linear`` for one row, oneDNN from two), the choice before per-shape paths (one path per row count for
every product: the one whose total over the model's products was faster, of ``F.linear`` and oneDNN), and
the engine's choice now (per weight shape and row count, of three paths: ``cloud.invariance.free_products``).
Alternated in one process, one torch thread, a 300-token context: the median of 9 each. Writes the JSON
report to the path given (default /tmp/ab.json)."""

import json
import statistics
import sys
import time

import torch

from cloud.engine import ForwardItem, TargetEngine
from cloud.invariance.free_products import BLAS, ONEDNN, PATHS, PRIOR, PROBE_ROWS, FreeProducts
from cloud.invariance.products import PackedLinear
from cloud.models import resolve_target
from sim.experiment.provenance import provenance

made = {**provenance(), "command": " ".join(["python", *sys.argv])}

torch.set_num_threads(1)
engine = TargetEngine(resolve_target(None), shapes="free")
packed = [m for m in engine.model.modules() if isinstance(m, PackedLinear)]
measured = engine.free_products
count = {}
for m in packed:
    count[(m.in_features, m.out_features)] = count.get((m.in_features, m.out_features), 0) + 1
# One path per row count for the whole model: BLAS or oneDNN, whichever totals less over its products.
whole = {}
for rows in PROBE_ROWS:
    total = {p: sum(n * measured.ms[s][rows][PATHS.index(p)] for s, n in count.items()) for p in (BLAS, ONEDNN)}
    whole[rows] = BLAS if total[BLAS] < total[ONEDNN] else ONEDNN
one_path = FreeProducts({s: tuple(whole[r] for r in PROBE_ROWS) for s in count}, measured.ms, "one path per row count")
choices = {"prior": PRIOR, "one path a row count": one_path, "per shape": measured}
for name, choice in choices.items():
    print(f"{name}: {choice.describe()}")
seq = engine.new_sequence()
engine.forward(seq, list(range(100, 400)), last_only=True)
out = {}
for rows in (1, 2, 3, 4, 6, 9, 12, 16):
    times = {name: [] for name in choices}
    for _ in range(9):
        for name, choice in choices.items():
            for module in packed:
                module.free = choice
            started = time.perf_counter()
            engine.forward_batch([ForwardItem(seq, [500 + i for i in range(rows)])])
            times[name].append(1e3 * (time.perf_counter() - started))
            engine.crop(seq, 300)
    out[rows] = {name: round(statistics.median(values), 1) for name, values in times.items()}
    print(rows, out[rows], flush=True)
with open(sys.argv[1] if len(sys.argv) > 1 else "/tmp/ab.json", "w") as file:
    json.dump({"provenance": made, "threads": 1, "choices": {n: c.describe() for n, c in choices.items()},
               "measured_ms": {f"{s[0]}x{s[1]}": {r: dict(zip(PATHS, t)) for r, t in by.items()}
                               for s, by in measured.ms.items()},
               "forward_ms_median_of_9": out}, file, indent=1)
