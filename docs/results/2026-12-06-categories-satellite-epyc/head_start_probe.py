"""Paired probe on a link scenario (default satellite): the adaptive schedule with and without its head start.

Usage: python head_start_probe.py RUNG[,RUNG...] [fixed] (run from the repository root, the venv's python);
with ``fixed``, the arms are instead the adaptive schedule and fixed pipelined D 8, window 4 and 8. One
cloud, one emulated link; per prompt (every other of the category bench's 16) the fastest cloud-only once,
then the two arms in alternating order, each asserted token-identical to cloud-only. The arm without the
head start runs its edge with a ``sitecustomize`` that sets ``Tunables.start_chain_tokens`` to infinity
(``Controller.start`` then never starts with the cloud alone); nothing else differs.
"""
import os
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from sim.experiment.categories import probe_lines
from sim.experiment.processes import cloud_behind_link, core_split, run_edge_process
from sim.link.scenario import load_scenario

NO_HEAD_START = ('import edge.tunables as _t\n'
                 'object.__setattr__(_t.TUNABLES, "start_chain_tokens", float("inf"))\n')
ADAPTIVE = ["--schedule", "adaptive", "--draft-len", "8", "--window", "4", "--lookup", "--hedge", "0"]
FIXED = {"pipe D8W4": ["--schedule", "pipelined", "--draft-len", "8", "--window", "4", "--hedge", "0"],
         "pipe D8W8": ["--schedule", "pipelined", "--draft-len", "8", "--window", "8", "--hedge", "0"]}

scen = load_scenario(os.environ.get("SCEN", "satellite"))
edge_cores, cloud_cores = core_split()


def edge(args: list[str], site: str | None = None) -> dict:
    return run_edge_process(args, edge_cores, env={"PYTHONPATH": site} if site else None).to_json()


with ExitStack() as stack, tempfile.TemporaryDirectory() as site:
    Path(site, "sitecustomize.py").write_text(NO_HEAD_START)
    cloud, link = cloud_behind_link(stack, scen.link, cloud_cores)
    for rung, drafter, _, cat, q, sampling in probe_lines(sys.argv[1].split(",")):
        base = edge(["baseline", "--cloud", link.address, "--drafter", drafter, *sampling])
        base_rate = len(base["tokens"]) / base["wall_s"]
        line = f"{rung:8s}{cat:11s} #{q.question_id:<4d} cloud-only {base_rate:5.2f}"
        if sys.argv[2:] == ["fixed"]:
            arms = [("adaptive", ADAPTIVE, None), *((name, args, None) for name, args in FIXED.items())]
        else:
            arms = [("head start", ADAPTIVE, None), ("no head start", ADAPTIVE, site)]
            arms = arms if q.question_id % 2 else arms[::-1]
        for name, schedule, arm_site in arms:
            r = edge(["run", "--cloud", link.address, "--drafter", drafter, *sampling, *schedule], arm_site)
            assert r["tokens"] == base["tokens"], (rung, q.question_id, name)
            line += f"  {name} {len(r['tokens']) / r['wall_s'] / base_rate:.2f}x"
        print(line, flush=True)
