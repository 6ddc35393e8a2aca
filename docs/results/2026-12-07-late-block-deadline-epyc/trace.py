"""Trace one category prompt at this tree: the edge with -vv (plan lines) twice, cloud-only between.
Usage: SCEN=acespec-50k python trace.py QID SEED RUNG [extra edge flags...]"""
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

qid, seed, rung, extra = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
    address, edge_cores, sampling = probe_rig(stack, os.environ.get("SCEN", "acespec-50k"), qid, int(seed))
    out = Path(tmp) / "r.json"
    for arm in ("split", "cloud", "split"):
        env = _env(len(edge_cores))
        if arm == "cloud":
            cmd = [*side_command("splitspec-edge", "edge.cli"), "baseline", "--cloud", address,
                   "--drafter", drafter_rung(rung).path, *sampling, "--json-file", str(out)]
        else:
            cmd = [*side_command("splitspec-edge", "edge.cli"), "-vv", "run", "--cloud", address,
                   "--drafter", drafter_rung(rung).path, *sampling, "--schedule", "adaptive", "--draft-len", "8",
                   "--window", "4", "--hedge", "0", *([] if os.environ.get("NOLOOKUP") else ["--lookup"]), "--json-file", str(out), *extra]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, preexec_fn=_pinned(edge_cores))
        print(f"=== {arm}", p.returncode)
        if p.returncode:
            print(p.stderr[-3000:])
            continue
        for line in p.stderr.splitlines():
            if "edge.decode_loop" in line:
                print(line.split("edge.decode_loop: ")[-1][:400])
        result = json.loads(out.read_text())
        print(f"{len(result['tokens']) / result['wall_s']:.2f} tok/s, switches {result.get('switches')}", flush=True)
        print({k: v for k, v in result.items() if k not in ('tokens', 'text')})
