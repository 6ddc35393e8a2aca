"""Paired A/B of two edges against one cloud, adaptive schedule: the arms differ in what comes first on
their ``PYTHONPATH``.

Usage: SCEN=acespec-50k [PATH_A=P] [PATH_B=P] [WINDOW_A=W] [WINDOW_B=W] python ab_edges.py RUNG[,RUNG...]
SEED[,SEED...] (from the repository root, the venv's python). Each arm passes ``--window`` W (default 4;
``none``: no ``--window``, the arm's own default). Each arm runs the edge with its path (none: the checkout's own code and
the venv's packages) first on ``PYTHONPATH``: a folder holding another build's ``llama_cpp`` package (the same
llama-cpp-python release compiled with other CMAKE_ARGS), or ``/tmp/base-site:/tmp/arm-X``, a ``git archive``
of another commit behind a ``sitecustomize.py`` that drops the editable install's finder. Per prompt (every
other of the category bench's 16) and seed: cloud-only once, then the arms in alternating order, each asserted
token-identical to cloud-only. Prints each arm's speedup, its drafter's milliseconds a drafted token and its
tokens drafted a committed token, then per rung the medians, the paired B/A ratio and each arm's cloud forwards
and drafted tokens per committed token (medians over prompts).
"""
import os
import statistics
import sys
from contextlib import ExitStack

from sim.experiment.categories import probe_lines
from sim.experiment.processes import cloud_behind_link, core_split, run_edge_process
from sim.link.scenario import load_scenario

rungs, seeds = sys.argv[1].split(","), tuple(int(x) for x in sys.argv[2].split(","))
scen = load_scenario(os.environ.get("SCEN", "acespec-50k"))
edge_cores, cloud_cores = core_split()
ADAPTIVE = ["--schedule", "adaptive", "--draft-len", "8", "--lookup", "--drafter-threads", "1"]
# Each arm's --window: WINDOW_A / WINDOW_B (default 4), "none" for none (the arm's own default).
WINDOWS = {arm: [] if os.environ.get(f"WINDOW_{arm}", "4") == "none" else ["--window", os.environ.get(f"WINDOW_{arm}", "4")]
           for arm in "AB"}
ENVS = {arm: {"PYTHONPATH": os.environ[f"PATH_{arm}"]} if os.environ.get(f"PATH_{arm}") else None for arm in "AB"}

rows, draft_ms, forwards, drafted = [], {"A": [], "B": []}, {"A": [], "B": []}, {"A": [], "B": []}
with ExitStack() as stack:
    cloud, link = cloud_behind_link(stack, scen.link, cloud_cores)
    for n, (rung, drafter, seed, cat, q, sampling) in enumerate(probe_lines(rungs, seeds)):
        base = run_edge_process(["baseline", "--cloud", link.address, "--drafter", drafter, *sampling],
                                edge_cores).to_json()
        base_rate = len(base["tokens"]) / base["wall_s"]
        speed, ms = {}, {}
        for arm in (("A", "B") if n % 2 == 0 else ("B", "A")):
            r = run_edge_process(["run", "--cloud", link.address, "--drafter", drafter, *sampling, *ADAPTIVE, *WINDOWS[arm]],
                                 edge_cores, env=ENVS[arm]).to_json()
            assert r["tokens"] == base["tokens"], (arm, rung, q.question_id)
            speed[arm] = len(r["tokens"]) / r["wall_s"] / base_rate
            d = r["drafter"]
            ms[arm] = 1e3 * (d["draft_s"] - d["prompt_eval_s"]) / max(d["drafted"], 1)
            draft_ms[arm].append((rung, ms[arm]))
            forwards[arm].append((rung, r["decode"]["target_forwards"] / len(r["tokens"])))
            drafted[arm].append((rung, d["drafted"] / len(r["tokens"])))
        rows.append((rung, speed["A"], speed["B"]))
        print(f"{rung:8s} s{seed} {cat:11s} #{q.question_id:<4d} cloud-only {base_rate:5.2f} tok/s  "
              f"A {speed['A']:.2f}x ({ms['A']:.1f} ms a draft, {drafted['A'][-1][1]:.1f} a token)  "
              f"B {speed['B']:.2f}x ({ms['B']:.1f} ms a draft, {drafted['B'][-1][1]:.1f} a token)",
              flush=True)
print(f"{scen.name}, {os.cpu_count()} cores, A: {ENVS['A']}, B: {ENVS['B']}")
for rung in rungs:
    a, b = ([m for r, m in draft_ms[arm] if r == rung] for arm in ("A", "B"))
    sa, sb = ([r[i] for r in rows if r[0] == rung] for i in (1, 2))
    print(f"{rung:8s} A: median {statistics.median(sa):.2f}x ({min(sa):.2f}-{max(sa):.2f}), "
          f"{statistics.median(a):.2f} ms a draft; B: median {statistics.median(sb):.2f}x ({min(sb):.2f}-{max(sb):.2f}), "
          f"{statistics.median(b):.2f} ms a draft; paired B/A speed {statistics.median(y / x for x, y in zip(sa, sb)):.3f}, "
          f"B faster on {sum(y > x for x, y in zip(sa, sb))} of {len(sa)}; cloud forwards a token A "
          + " B ".join(f"{statistics.median(f for r, f in forwards[arm] if r == rung):.3f}" for arm in "AB")
          + "; drafted a token A " + " B ".join(f"{statistics.median(f for r, f in drafted[arm] if r == rung):.2f}"
                                                for arm in "AB"))
