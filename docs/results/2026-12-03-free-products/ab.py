"""Free-shape forwards of Gemma 3 270M by appended rows, products on the prior rule against the choice the
engine measured on this machine (``cloud.invariance.free_products``), alternated in one process, one
torch thread: the median of 7 each. Writes /tmp/ab.json (the folder's result.json adds its provenance)."""

import json
import statistics
import time

import torch

from cloud.engine import ForwardItem, TargetEngine
from cloud.invariance.free_products import PRIOR
from cloud.invariance.products import PackedLinear
from cloud.models import resolve_target

torch.set_num_threads(1)
engine = TargetEngine(resolve_target(None), shapes="free")
packed = [m for m in engine.model.modules() if isinstance(m, PackedLinear)]
measured = engine.free_products
print(measured.describe())
seq = engine.new_sequence()
engine.forward(seq, list(range(100, 400)), last_only=True)
out = {}
for rows in (1, 2, 3, 4, 9, 16):
    times = {"prior": [], "measured": []}
    for _ in range(7):
        for name, choice in (("prior", PRIOR), ("measured", measured)):
            for module in packed:
                module.free = choice
            started = time.perf_counter()
            engine.forward_batch([ForwardItem(seq, [500 + i for i in range(rows)])])
            times[name].append(1e3 * (time.perf_counter() - started))
            engine.crop(seq, 300)
    out[rows] = {name: round(statistics.median(values), 1) for name, values in times.items()}
    print(rows, out[rows], flush=True)
cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
with open("/tmp/ab.json", "w") as file:
    json.dump({"cpu": cpu, "threads": 1, "choice": measured.describe(), "ms_median_of_7": out}, file, indent=1)
