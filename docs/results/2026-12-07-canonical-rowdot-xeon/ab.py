"""Canonical-shape (reproducible) forwards of Gemma 3 270M by appended rows, the linear layers' canonical
products on oneDNN (the path before) against ``canonical_path``'s (rowdot's widest build that takes the
weight). One canonical engine, its padding as probed at load; alternated in one process, one torch
thread, a 300-token context, median of 9. Also whether each path holds at the engine's tile
(``invariant_row_padding`` on its products). Writes the JSON report to the path given."""

import json
import statistics
import sys

import torch

from cloud.engine import TargetEngine
from cloud.invariance.free_products import ONEDNN
from cloud.invariance.probe import invariant_row_padding, linear_products
from cloud.invariance.products import PackedLinear, canonical_path
from cloud.models import resolve_target
from sim.bench.forward_rows import alternated_forward_ms
from sim.experiment.provenance import provenance

made = {**provenance(), "command": " ".join(["python", *sys.argv])}
torch.set_num_threads(1)
engine = TargetEngine(resolve_target(None), shapes="canonical")
packed = [m for m in engine.model.modules() if isinstance(m, PackedLinear)]
arms = {"onednn": {m: ONEDNN for m in packed}, "rowdot": {m: canonical_path(m.weight) for m in packed}}


def enter(paths: dict) -> None:
    for module, path in paths.items():
        module.canonical = path


holds = {}
for name, paths in arms.items():
    enter(paths)
    holds[name] = repr(invariant_row_padding(linear_products(engine.model), engine.row_tiles))
print("engine:", engine.canonical_paths(), engine.padding, engine.attention_padding, "threads", engine.threads)
print("padding that holds per arm:", holds, flush=True)
out = {}
entering = {name: (lambda arm=arm: enter(arm)) for name, arm in arms.items()}
for rows, times in alternated_forward_ms(engine, entering, (1, 2, 3, 4, 6, 9, 12, 16), 9, reproducible=True):
    out[rows] = {name: round(statistics.median(values), 1) for name, values in times.items()}
    print(rows, out[rows], flush=True)
with open(sys.argv[1] if len(sys.argv) > 1 else "/tmp/ab.json", "w") as file:
    json.dump({"provenance": made, "threads": 1, "padding": repr(engine.padding),
               "attention_padding": repr(engine.attention_padding), "padding_that_holds": holds,
               "canonical_paths": {name: sorted(set(paths.values())) for name, paths in arms.items()},
               "forward_ms_median_of_9": out}, file, indent=1)
