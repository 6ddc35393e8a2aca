"""Paired probe on a link scenario (default satellite): the adaptive schedule with and without its head start.

Usage: python head_start_probe.py RUNG[,RUNG...] [fixed] (run from the repository root, the venv's python);
with ``fixed``, the arms are instead the adaptive schedule and fixed pipelined D 8, window 4 and 8. One
cloud, one emulated link; per prompt (every other of the category bench's 16) the fastest cloud-only once,
then the two arms in alternating order, each asserted token-identical to cloud-only. The arm without the
head start runs its edge with a ``sitecustomize`` that sets ``Tunables.start_chain_tokens`` to infinity
(``Controller.start`` then never starts with the cloud alone); nothing else differs.
"""
import json
import os
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from cloud.models import resolve_target
from sim.experiment.categories import render_first_turn
from sim.experiment.processes import BackgroundLink, CloudProcess, _env, _pinned, core_split, side_command
from sim.fixtures.drafter_ladder import drafter_rung
from sim.link.scenario import load_scenario
from sim.workloads.mtbench import sample_by_category

NO_HEAD_START = ('import edge.tunables as _t\n'
                 'object.__setattr__(_t.TUNABLES, "start_chain_tokens", float("inf"))\n')
ADAPTIVE = ["--schedule", "adaptive", "--draft-len", "8", "--window", "4", "--lookup", "--hedge", "0"]
FIXED = {"pipe D8W4": ["--schedule", "pipelined", "--draft-len", "8", "--window", "4", "--hedge", "0"],
         "pipe D8W8": ["--schedule", "pipelined", "--draft-len", "8", "--window", "8", "--hedge", "0"]}

scen = load_scenario(os.environ.get("SCEN", "satellite"))
edge_cores, cloud_cores = core_split()
questions = [(c, q) for c, items in sample_by_category(2, 0).items() for q in items][::2]


def edge(args: list[str], site: str | None = None) -> dict:
    env = _env(len(edge_cores)) | ({"PYTHONPATH": site} if site else {})
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        p = subprocess.run([*side_command("splitspec-edge", "edge.cli"), *args, "--json-file", str(out)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                           preexec_fn=_pinned(edge_cores))
        if not out.exists():
            raise RuntimeError(p.stderr[-3000:])
        return json.loads(out.read_text())


with ExitStack() as stack, tempfile.TemporaryDirectory() as site:
    Path(site, "sitecustomize.py").write_text(NO_HEAD_START)
    cloud = stack.enter_context(CloudProcess(str(resolve_target(None)), cloud_cores, extra_args=["--shapes", "auto"]))
    link = stack.enter_context(BackgroundLink(scen.link, cloud.port))
    for rung in sys.argv[1].split(","):
        drafter = drafter_rung(rung).path
        for cat, q in questions:
            sampling = ["--prompt", render_first_turn(q.turns[0]), "--max-new-tokens", "64", "--temperature", "0.7",
                        "--seed", "0", "--mode", "coupled", "--drafter-threads", "1"]
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
