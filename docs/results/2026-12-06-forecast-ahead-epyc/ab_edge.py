"""Paired A/B of two edges (A: another checkout, B: this tree) against one cloud (this tree), adaptive schedule.

Usage: SCEN=satellite python ab_edge.py RUNG[,RUNG...] SEED[,SEED...] ARM_A_DIR (from the repository root,
the venv's python; ARM_A_DIR a ``git archive`` of the other commit, /tmp/base-site holding the
``sitecustomize`` that drops the editable install's import finder so PYTHONPATH's checkout wins). Per
prompt (every other of the category bench's 16) and seed: cloud-only once, then the two edges in alternating
order, each asserted token-identical to cloud-only. Prints each arm's speedup, its switches between drafting
and the cloud alone, and the cloud's seconds inside target forwards per committed token against cloud-only's
(``splitspec_engine_busy_seconds``); then per rung the medians, the worst prompt and the paired B/A ratio.
"""
import os
import sys
from contextlib import ExitStack

from sim.experiment.categories import paired_summary, probe_lines
from sim.experiment.processes import cloud_behind_link, core_split, run_edge_process
from sim.link.scenario import load_scenario

rungs, seeds, arm_a = sys.argv[1].split(","), tuple(int(x) for x in sys.argv[2].split(",")), sys.argv[3]
scen = load_scenario(os.environ.get("SCEN", "satellite"))
edge_cores, cloud_cores = core_split()
BUSY = "splitspec_engine_busy_seconds_total"
ADAPTIVE = ["--schedule", "adaptive", "--draft-len", "8", "--window", "4", "--hedge", "0", "--lookup",
            "--drafter-threads", "1"]


def edge(args: list[str], arm: str = "B") -> dict:
    env = {"PYTHONPATH": f"/tmp/base-site:{arm_a}"} if arm == "A" else None
    return run_edge_process(args, edge_cores, env=env).to_json()


rows = []
with ExitStack() as stack:
    cloud, link = cloud_behind_link(stack, scen.link, cloud_cores)
    n = 0
    for rung, drafter, seed, cat, q, sampling in probe_lines(rungs, seeds):
        busy = cloud.metric(BUSY)
        base = edge(["baseline", "--cloud", link.address, "--drafter", drafter, *sampling])
        base_rate = len(base["tokens"]) / base["wall_s"]
        base_busy = (cloud.metric(BUSY) - busy) / len(base["tokens"])
        speed, cost, switches = {}, {}, {}
        for arm in (("A", "B") if n % 2 == 0 else ("B", "A")):
            busy = cloud.metric(BUSY)
            r = edge(["run", "--cloud", link.address, "--drafter", drafter, *sampling, *ADAPTIVE], arm)
            assert r["tokens"] == base["tokens"], (arm, rung, q.question_id)
            speed[arm] = len(r["tokens"]) / r["wall_s"] / base_rate
            cost[arm] = (cloud.metric(BUSY) - busy) / len(r["tokens"]) / base_busy
            switches[arm] = r["switches"]
        n += 1
        rows.append((rung, speed["A"], speed["B"], cost["A"], cost["B"]))
        print(f"{rung:8s} s{seed} {cat:11s} #{q.question_id:<4d} cloud-only {base_rate:5.2f} tok/s  "
              f"A {speed['A']:.2f}x ({switches['A']} sw, cost {cost['A']:.2f})  "
              f"B {speed['B']:.2f}x ({switches['B']} sw, cost {cost['B']:.2f})", flush=True)
print(f"{scen.name}, {os.cpu_count()} cores")
print(*paired_summary(rungs, rows), sep="\n")
