"""Cloud-only (``Generate``) against the split's cloud alone (``--schedule pipelined --draft-len 0 --window 4``).

Usage: SCEN=acespec-50k [LENGTHS=64,256] python cloud_alone.py (from the repository root, the venv's python).
The first 4 of the category bench's 8 probe prompts (the q2_k rung's sampling, seed 0), at each length, twice:
one run of each arm against one cloud behind the link, asserted token-identical. Prints each pair's tokens/s,
their ratio and the difference in wall seconds, then the median ratio per length: a fixed difference is a
start-up cost, one that grows with the length a per-token one.
"""
import os
import statistics
from contextlib import ExitStack
from itertools import islice

from sim.experiment.categories import probe_lines
from sim.experiment.processes import cloud_behind_link, core_split, run_edge_process
from sim.link.scenario import load_scenario

scen = load_scenario(os.environ.get("SCEN", "acespec-50k"))
edge_cores, cloud_cores = core_split()
ALONE = ["--schedule", "pipelined", "--draft-len", "0", "--window", "4"]
ratios = {}
with ExitStack() as stack:
    cloud, link = cloud_behind_link(stack, scen.link, cloud_cores)
    for _, drafter, _, _, q, sampling in islice(probe_lines(["q2_k"], (0,)), 4):
        for length in os.environ.get("LENGTHS", "64,256").split(","):
            asked = [length if x == "64" else x for x in sampling]  # (``--max-new-tokens 64``)
            for _ in range(2):
                b = run_edge_process(["baseline", "--cloud", link.address, "--drafter", drafter, *asked],
                                     edge_cores).to_json()
                a = run_edge_process(["run", "--cloud", link.address, "--drafter", drafter, *asked, *ALONE],
                                     edge_cores).to_json()
                assert a["tokens"] == b["tokens"], q.question_id
                rb, ra = len(b["tokens"]) / b["wall_s"], len(a["tokens"]) / a["wall_s"]
                ratios.setdefault(length, []).append(ra / rb)
                print(f"#{q.question_id} {length} tokens {len(b['tokens'])}: cloud-only {rb:.2f} alone {ra:.2f} "
                      f"ratio {ra / rb:.3f}; wall {b['wall_s']:.3f} vs {a['wall_s']:.3f} "
                      f"(diff {a['wall_s'] - b['wall_s']:+.3f} s)", flush=True)
for length, values in ratios.items():
    print(length, "median ratio", round(statistics.median(values), 3), [round(x, 3) for x in values])
