"""rowdot with and without prefetching the next block of weight rows: Gemma 3's 262144 x 640 head, one
thread, alternated, median of 9. A: ``cloud/invariance/rowdot.c`` as committed at e23b79f (no prefetch),
B: the tree's. Both compiled here with rowdot.py's flags; asserts both give the same bits. Writes the
JSON report to the path given (default /tmp/prefetch.json). Run from the repository root."""

import ctypes
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from cloud.invariance.rowdot import FLAGS, SOURCE
from sim.experiment.provenance import provenance

made = {**provenance(), "command": " ".join(["python", *sys.argv])}
torch.set_num_threads(1)
libs = {}
with tempfile.TemporaryDirectory() as tmp:
    before = Path(tmp) / "before.c"
    before.write_text(subprocess.run(["git", "show", "e23b79f:cloud/invariance/rowdot.c"], capture_output=True,
                                     text=True, check=True).stdout)
    for name, source in (("without prefetch", before), ("with prefetch", SOURCE)):
        built = Path(tmp) / f"{len(libs)}.so"
        subprocess.run(["cc", *FLAGS, "-o", str(built), str(source)], check=True)
        libs[name] = ctypes.CDLL(str(built))
        libs[name].rowdot.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long] * 3


def run(lib, x, w):
    out = torch.empty(x.shape[0], w.shape[0])
    lib.rowdot(x.data_ptr(), w.data_ptr(), out.data_ptr(), x.shape[0], w.shape[0], w.shape[1])
    return out


weight = torch.randn(262144, 640) * 0.02
report = {}
for rows in (1, 2, 4, 9, 16):
    x = torch.randn(rows, 640)
    first, second = (run(lib, x, weight) for lib in libs.values())
    assert torch.equal(first, second)
    times = {name: [] for name in libs}
    for _ in range(9):
        for name, lib in libs.items():
            started = time.perf_counter()
            run(lib, x, weight)
            times[name].append(1e3 * (time.perf_counter() - started))
    report[rows] = {name: round(statistics.median(values), 1) for name, values in times.items()}
    print(rows, report[rows], flush=True)
with open(sys.argv[1] if len(sys.argv) > 1 else "/tmp/prefetch.json", "w") as file:
    json.dump({"provenance": made, "threads": 1, "head_ms_median_of_9": report}, file, indent=1)
