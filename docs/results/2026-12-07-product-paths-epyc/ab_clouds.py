"""Paired A/B of two clouds (A: another checkout, B: this tree) where both cloud-only and the split change:
per prompt, cloud-only on each cloud and the split on each, in alternating order, one edge code.

Usage: SCEN=acespec-50k python ab_clouds.py RUNG[,RUNG...] SEED[,SEED...] ARM_A_DIR [QID,...] (from the
repository root, the venv's python; ARM_A_DIR a ``git archive`` of the other commit, /tmp/base-site holding
the ``sitecustomize`` that drops the editable install's import finder, so PYTHONPATH's checkout wins for
cloud A). Every other of the category bench's 16 prompts, 64 tokens, coupled T 0.7, adaptive D <= 8, window 4,
prompt lookup first; ``EDGE_EXTRA`` (default empty) adds edge flags to both arms' sessions, such as
``--reproducible``. Prints per line each cloud's cloud-only tok/s and its split's speedup against its own
cloud-only, whether the split's tokens equal its cloud's cloud-only's, then per rung the medians and the
paired B/A ratios of cloud-only and of the split."""
import json
import os
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from cloud.models import resolve_target
from sim.experiment.categories import probe_lines
from sim.experiment.processes import BackgroundLink, CloudProcess, _env, _pinned, core_split, side_command
from sim.link.scenario import load_scenario

rungs, seeds, arm_a = sys.argv[1].split(","), tuple(int(x) for x in sys.argv[2].split(",")), sys.argv[3]
only = {int(x) for x in sys.argv[4].split(",")} if len(sys.argv) > 4 else None
scen = load_scenario(os.environ.get("SCEN", "acespec-50k"))
edge_cores, cloud_cores = core_split()
ADAPTIVE = ["--draft-len", "8", "--schedule", "adaptive", "--window", "4", "--hedge", "0", "--lookup"]
EXTRA = os.environ.get("EDGE_EXTRA", "").split()


def edge(args):
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        p = subprocess.run([*side_command("splitspec-edge", "edge.cli"), *args, "--json-file", str(out)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           env=_env(len(edge_cores)), preexec_fn=_pinned(edge_cores))
        if not out.exists():
            raise RuntimeError(p.stderr[-3000:])
        return json.loads(out.read_text())


target = str(resolve_target(None))
rows = []
with ExitStack() as stack:
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = f"/tmp/base-site:{arm_a}"
    cloud_a = stack.enter_context(CloudProcess(target, cloud_cores, extra_args=["--shapes", "auto"]))
    if saved is None:
        del os.environ["PYTHONPATH"]
    else:
        os.environ["PYTHONPATH"] = saved
    cloud_b = stack.enter_context(CloudProcess(target, cloud_cores, extra_args=["--shapes", "auto"]))
    links = {"A": stack.enter_context(BackgroundLink(scen.link, cloud_a.port)),
             "B": stack.enter_context(BackgroundLink(scen.link, cloud_b.port))}
    n = 0
    for rung, drafter, seed, cat, q, sampling in probe_lines(rungs, seeds):
        if only and q.question_id not in only:
            continue
        base, split, same = {}, {}, {}
        order = ("A", "B") if n % 2 == 0 else ("B", "A")
        for arm in order:
            r = edge(["baseline", "--cloud", links[arm].address, "--drafter", drafter, *sampling, *EXTRA])
            base[arm] = (len(r["tokens"]) / r["wall_s"], r["tokens"])
        for arm in order:
            r = edge(["run", "--cloud", links[arm].address, "--drafter", drafter, *sampling, *ADAPTIVE, *EXTRA])
            split[arm] = len(r["tokens"]) / r["wall_s"]
            same[arm] = r["tokens"] == base[arm][1]
        n += 1
        rows.append((rung, base["A"][0], base["B"][0], split["A"], split["B"]))
        print(f"{rung:8s} s{seed} {cat:11s} #{q.question_id:<4d} cloud-only A {base['A'][0]:5.2f} B {base['B'][0]:5.2f} tok/s  "
              f"split A {split['A']:5.2f} ({split['A'] / base['A'][0]:.2f}x) B {split['B']:5.2f} ({split['B'] / base['B'][0]:.2f}x)"
              f"  identical A {same['A']} B {same['B']}", flush=True)
print(f"{scen.name}, {os.cpu_count()} cores")
for rung in rungs:
    sel = [r for r in rows if r[0] == rung]
    med = statistics.median
    print(f"{rung}: cloud-only median A {med(r[1] for r in sel):.2f} B {med(r[2] for r in sel):.2f} tok/s, paired B/A "
          f"{med(r[2] / r[1] for r in sel):.3f} (B faster on {sum(r[2] > r[1] for r in sel)}/{len(sel)})")
    print(f"{rung}: split median A {med(r[3] for r in sel):.2f} B {med(r[4] for r in sel):.2f} tok/s, paired B/A "
          f"{med(r[4] / r[3] for r in sel):.3f} (B faster on {sum(r[4] > r[3] for r in sel)}/{len(sel)})")
    a, b = [r[3] / r[1] for r in sel], [r[4] / r[2] for r in sel]
    print(f"{rung}: speedup against its own cloud-only, median A {med(a):.2f}x (min {min(a):.2f}, below 0.95: "
          f"{sum(x < 0.95 for x in a)}) B {med(b):.2f}x (min {min(b):.2f}, below 0.95: {sum(x < 0.95 for x in b)})")
