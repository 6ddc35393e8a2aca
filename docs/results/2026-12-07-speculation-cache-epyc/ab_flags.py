"""Paired A/B of one edge without (A) and with (B) extra flags against one cloud, adaptive schedule.

Usage: SCEN=acespec-50k python ab_flags.py RUNG[,RUNG...] SEED[,SEED...] FLAG [FLAG...] (from the repository
root, the venv's python). Per prompt (every other of the category bench's 16; LIMIT=n: the first n) and seed:
cloud-only once, then the two arms in alternating order, each asserted token-identical to cloud-only. Prints
each arm's speedup, its switches, the cloud's seconds inside target forwards per committed token against
cloud-only's (``splitspec_engine_busy_seconds``) and B's speculation-cache counters; then per rung the
medians, the worst prompt and the paired B/A ratio.
"""
import os
import sys
from contextlib import ExitStack

from sim.experiment.categories import paired_summary, probe_lines
from sim.experiment.processes import cloud_behind_link, core_split, run_edge_process
from sim.link.scenario import load_scenario

rungs, seeds, flags = sys.argv[1].split(","), tuple(int(x) for x in sys.argv[2].split(",")), sys.argv[3:]
scen = load_scenario(os.environ.get("SCEN", "acespec-50k"))
limit = int(os.environ.get("LIMIT", "0")) or None
edge_cores, cloud_cores = core_split()
BUSY = "splitspec_engine_busy_seconds_total"
ADAPTIVE = ["--schedule", "adaptive", "--draft-len", "8", "--window", "4", "--hedge", "0", "--lookup",
            "--drafter-threads", "1"]
ARMS = {"A": [], "B": flags}

rows = []
with ExitStack() as stack:
    cloud, link = cloud_behind_link(stack, scen.link, cloud_cores)
    n, done = 0, {}
    for rung, drafter, seed, cat, q, sampling in probe_lines(rungs, seeds):
        done[rung] = done.get(rung, 0) + 1
        if limit and done[rung] > limit:
            continue
        busy = cloud.metric(BUSY)
        base = run_edge_process(["baseline", "--cloud", link.address, "--drafter", drafter, *sampling],
                                edge_cores).to_json()
        base_rate = len(base["tokens"]) / base["wall_s"]
        base_busy = (cloud.metric(BUSY) - busy) / len(base["tokens"])
        speed, cost, report = {}, {}, {}
        for arm in (("A", "B") if n % 2 == 0 else ("B", "A")):
            busy = cloud.metric(BUSY)
            r = run_edge_process(["run", "--cloud", link.address, "--drafter", drafter, *sampling, *ADAPTIVE,
                                  *ARMS[arm]], edge_cores).to_json()
            assert r["tokens"] == base["tokens"], (arm, rung, q.question_id)
            speed[arm] = len(r["tokens"]) / r["wall_s"] / base_rate
            cost[arm] = (cloud.metric(BUSY) - busy) / len(r["tokens"]) / base_busy
            report[arm] = r
        n += 1
        rows.append((rung, speed["A"], speed["B"], cost["A"], cost["B"]))
        s = report["B"]["decode"]
        print(f"{rung:8s} s{seed} {cat:11s} #{q.question_id:<4d} cloud-only {base_rate:5.2f} tok/s  "
              f"A {speed['A']:.2f}x ({report['A']['switches']} sw, cost {cost['A']:.2f}, restarts "
              f"{report['A']['decode']['restarts']} {report['A']['decode']['restart_draft_s']:.2f} s)  "
              f"B {speed['B']:.2f}x ({report['B']['switches']} sw, cost {cost['B']:.2f}, restarts {s['restarts']} "
              f"{s['restart_draft_s']:.2f} s; branches {s['cache_branches']} {s['cache_branch_s']:.2f} s, "
              f"hits {s['cache_hits']}, {s['cache_drafts']} drafts, {s['cache_hit_s']:.2f} s)", flush=True)
print(f"{scen.name}, {os.cpu_count()} cores, B: {' '.join(flags)}")
print(*paired_summary(rungs, rows), sep="\n")
