"""Paired A/B of two clouds (A: another checkout, B: this tree) on the category bench's prompts; one edge code.

Beside each line's speedup, the cloud's seconds inside target forwards per committed token
(``splitspec_engine_busy_seconds``), each arm's against the same line's cloud-only on cloud B."""
import json
import os
import statistics
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

rungs = sys.argv[1].split(",")
seeds = [int(x) for x in sys.argv[2].split(",")]
arm_a = sys.argv[3]
only = set(int(x) for x in sys.argv[4].split(",")) if len(sys.argv) > 4 else None
scen = load_scenario(os.environ.get("SCEN", "acespec-50k"))
edge_cores, cloud_cores = core_split()
qs = [(c, q) for c, items in sample_by_category(2, 0).items() for q in items if not only or q.question_id in only]

BUSY = "splitspec_engine_busy_seconds_total"


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
    warm = drafter_rung("default").path
    for c in (cloud_a, cloud_b):
        edge(["baseline", "--cloud", f"127.0.0.1:{c.port}", "--drafter", warm, "--prompt", "Hello", "--max-new-tokens", "4", "--temperature", "0"])
    rows = []
    n = 0
    for rung in rungs:
        drafter = drafter_rung(rung).path
        for seed in seeds:
            for cat, q in qs:
                prompt = render_first_turn(q.turns[0])
                samp = ["--prompt", prompt, "--max-new-tokens", "64", "--temperature", "0.7", "--seed", str(seed), "--mode", "coupled"]
                busy = cloud_b.metric(BUSY)
                base = edge(["baseline", "--cloud", links["B"].address, "--drafter", drafter, *samp])
                bt = len(base["tokens"]) / base["wall_s"]
                base_busy = (cloud_b.metric(BUSY) - busy) / len(base["tokens"])
                res, cost = {}, {}
                for arm in (("A", "B") if n % 2 == 0 else ("B", "A")):
                    cloud = cloud_a if arm == "A" else cloud_b
                    busy = cloud.metric(BUSY)
                    r = edge(["run", "--cloud", links[arm].address, "--drafter", drafter, *samp, "--draft-len", "8",
                              "--schedule", "adaptive", "--window", "4", "--hedge", "0", "--lookup", "--drafter-threads", "1"])
                    assert r["tokens"] == base["tokens"], (arm, q.question_id)
                    res[arm] = len(r["tokens"]) / r["wall_s"] / bt
                    cost[arm] = (cloud.metric(BUSY) - busy) / len(r["tokens"]) / base_busy
                n += 1
                rows.append((rung, seed, cat, q.question_id, res["A"], res["B"], cost["A"], cost["B"]))
                print(f"{rung:8s} s{seed} {cat:11s} #{q.question_id:<4d} cloud-only {bt:5.2f} tok/s  A {res['A']:.2f}x  B {res['B']:.2f}x  "
                      f"B/A {res['B']/res['A']:.3f}  cloud s/token vs cloud-only A {cost['A']:.3f} B {cost['B']:.3f}", flush=True)
    for rung in rungs:
        sel = [r for r in rows if r[0] == rung]
        a = [r[4] for r in sel]
        b = [r[5] for r in sel]
        print(f"{rung}: A median {statistics.median(a):.2f}x (min {min(a):.2f}, below 0.95: {sum(x < 0.95 for x in a)}) | "
              f"B median {statistics.median(b):.2f}x (min {min(b):.2f}, below 0.95: {sum(x < 0.95 for x in b)}) | "
              f"paired B/A median {statistics.median([y/x for x, y in zip(a, b)]):.3f}, B better on {sum(y > x for x, y in zip(a, b))}/{len(a)}")
        ca, cb = [r[6] for r in sel], [r[7] for r in sel]
        print(f"{rung}: cloud s/token vs cloud-only, median A {statistics.median(ca):.3f} B {statistics.median(cb):.3f}, "
              f"paired B/A median {statistics.median([y/x for x, y in zip(ca, cb)]):.3f}")
