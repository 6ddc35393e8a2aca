"""The adaptive controller's plans, both edges (A: another checkout, B: this tree), on one prompt, twice each.

Usage: SCEN=acespec-50k python plan_trace.py QUESTION_ID SEED RUNG (from the repository root, the venv's
python; /tmp/arm-old a ``git archive`` of the other commit and /tmp/base-site its ``sitecustomize``, as for
``ab_edge.py``). Runs the edges with ``-vv`` in the order A, B, A, B against one cloud over the emulated
link and prints each plan line (draft length, window, forecast) and the run's tokens/s.
"""
import json
import os
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from sim.experiment.categories import probe_rig
from sim.experiment.processes import _env, _pinned, side_command
from sim.fixtures.drafter_ladder import drafter_rung

qid, seed, rung = int(sys.argv[1]), sys.argv[2], sys.argv[3]
with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
    address, edge_cores, sampling = probe_rig(stack, os.environ.get("SCEN", "acespec-50k"), qid, int(seed))
    out = Path(tmp) / "r.json"
    for arm in ("A", "B", "A", "B"):
        env = _env(len(edge_cores)) | ({"PYTHONPATH": "/tmp/base-site:/tmp/arm-old"} if arm == "A" else {})
        p = subprocess.run([*side_command("splitspec-edge", "edge.cli"), "-vv", "run", "--cloud", address,
                            "--drafter", drafter_rung(rung).path, *sampling, "--schedule", "adaptive", "--draft-len", "8",
                            "--window", "4", "--hedge", "0", "--lookup", "--json-file", str(out)],
                           capture_output=True, text=True, env=env, preexec_fn=_pinned(edge_cores))
        print(f"=== arm {arm}")
        for line in p.stderr.splitlines():
            if "D=" in line and "predicted" in line:
                print(line.split("edge.decode_loop: ")[-1][:160])
        result = json.loads(out.read_text())
        print(f"{len(result['tokens']) / result['wall_s']:.2f} tok/s, {result['switches']} switches", flush=True)
