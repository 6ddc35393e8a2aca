"""Cloud-only (``Generate``) against the split's cloud alone (``--schedule pipelined --draft-len 0``), per prompt.

Usage: SCEN=satellite python docs/results/2026-12-07-cloud-window-zen5-epyc/cloud_alone_by_seed.py (from the
repository root, the venv's python). Every one of the category bench's 8 probe prompts under the default rung's
sampling, seeds 0 and 1: cloud-only once, then the cloud alone, against one cloud behind the scenario's link,
asserted token-identical. Prints each pair's tokens/s, first-token times and ratio, then the median and range.
"""
import os
import statistics
from contextlib import ExitStack

from sim.experiment.categories import probe_lines
from sim.experiment.processes import cloud_behind_link, core_split, run_edge_process
from sim.link.scenario import load_scenario

scen = load_scenario(os.environ.get("SCEN", "satellite"))
edge_cores, cloud_cores = core_split()
ratios = []
with ExitStack() as stack:
    cloud, link = cloud_behind_link(stack, scen.link, cloud_cores)
    for _, drafter, seed, _, q, sampling in probe_lines(["default"], (0, 1)):
        base = run_edge_process(["baseline", "--cloud", link.address, "--drafter", drafter, *sampling], edge_cores).to_json()
        alone = run_edge_process(["run", "--cloud", link.address, "--drafter", drafter, *sampling, "--schedule", "pipelined",
                                  "--draft-len", "0", "--window", "16"], edge_cores).to_json()
        assert alone["tokens"] == base["tokens"]
        b, a = len(base["tokens"]) / base["wall_s"], len(alone["tokens"]) / alone["wall_s"]
        ratios.append(a / b)
        print(f"#{q.question_id} s{seed} Generate {b:.2f} tok/s (ttft {base['ttft_s']:.2f}) alone {a:.2f} (ttft {alone['ttft_s']:.2f}) {a / b:.3f}", flush=True)
print(scen.name, "median", statistics.median(ratios), min(ratios), max(ratios))
