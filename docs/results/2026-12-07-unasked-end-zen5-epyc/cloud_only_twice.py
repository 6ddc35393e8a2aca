"""Cloud-only against itself: how far one run of a prompt moves from the next, on an emulated link.

Usage: SCEN=satellite python cloud_only_twice.py RUNG[,RUNG...] SEED[,SEED...] [RUNS] (from the repository root,
the venv's python). Per prompt (every other of the category bench's 16) and seed, cloud-only RUNS times (3 unless
given) against one cloud behind the link, each run asserted token-identical to the first. Prints each run's
tokens/s and its ratio to the median of the prompt's runs, then the spread of those ratios: what a per-prompt
ratio of one split run to one cloud-only run carries as noise before the split does anything.
"""
import os
import statistics
import sys
from contextlib import ExitStack

from sim.experiment.categories import probe_lines
from sim.experiment.processes import cloud_behind_link, core_split, run_edge_process
from sim.link.scenario import load_scenario

rungs, seeds = sys.argv[1].split(","), tuple(int(x) for x in sys.argv[2].split(","))
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 3
scen = load_scenario(os.environ.get("SCEN", "satellite"))
edge_cores, cloud_cores = core_split()

ratios = []
with ExitStack() as stack:
    cloud, link = cloud_behind_link(stack, scen.link, cloud_cores)
    for rung, drafter, seed, cat, q, sampling in probe_lines(rungs, seeds):
        rates, first = [], None
        for _ in range(runs):
            r = run_edge_process(["baseline", "--cloud", link.address, "--drafter", drafter, *sampling],
                                 edge_cores).to_json()
            first = first or r["tokens"]
            assert r["tokens"] == first, (rung, q.question_id)
            rates.append(len(r["tokens"]) / r["wall_s"])
        mid = statistics.median(rates)
        ratios += [rate / mid for rate in rates]
        print(f"{rung:8s} s{seed} {cat:11s} #{q.question_id:<4d} cloud-only "
              + "  ".join(f"{rate:5.2f} tok/s ({rate / mid:.2f})" for rate in rates), flush=True)
low = sum(x < 0.95 for x in ratios)
print(f"{scen.name}, {os.cpu_count()} cores: {len(ratios)} runs, ratio to their prompt's median "
      f"{min(ratios):.2f}-{max(ratios):.2f}, below 0.95 in {low} ({100 * low / len(ratios):.0f}%)")
