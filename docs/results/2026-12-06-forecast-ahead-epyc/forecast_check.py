"""How far the controller's chain forecast stands from what a fixed pipelined schedule measures.

Usage: SCEN=satellite python forecast_check.py RUNG[,RUNG...] [D W] (from the repository root, the
venv's python; D 8, window 4 by default). One cloud, one emulated link; per prompt (every other of the
category bench's 16): cloud-only once (its seconds a token price the cloud alone and a stale decode),
then fixed pipelined D/W with ``--timings``, asserted token-identical. From that run's own measurements
(conditional α per position from its accepted/drafted counts, drafting seconds a token, the round trip
net of the cloud, the median forward of a full block, the stale blocks' decoded share and rebased drafts)
``shared.acceptance.pipelined_chain`` forecasts tokens/s twice: as before decoding ahead was modelled
(``ahead_limit`` 0) and with it (the Open's draft limit, D + W - 1). Prints forecast / measured.
"""
import os
import statistics
import sys
from contextlib import ExitStack

from shared.acceptance import ChainCosts, pipelined_chain
from sim.experiment.categories import probe_lines
from sim.experiment.processes import cloud_behind_link, core_split, run_edge_process
from sim.link.scenario import load_scenario

scen = load_scenario(os.environ.get("SCEN", "satellite"))
D, W = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (8, 4)
edge_cores, cloud_cores = core_split()


def edge(args: list[str]) -> dict:
    return run_edge_process(args, edge_cores).to_json()


def conditional_alphas(decode: dict) -> list[float]:
    """α_i = P(draft i accepted | drafts < i accepted) from the run's per-position counts."""
    reach = [a / d for a, d in zip(decode["accepted_at"], decode["drafted_at"]) if d]
    return [min(max(r / p, 0.0), 1.0) if p else 0.0 for r, p in zip(reach, [1.0, *reach])]


def forecast(run: dict, cloud_token_s: float, ahead_limit: int) -> float:
    decode, drafter = run["decode"], run["drafter"]
    full = [b["cloud_s"] for b in run["blocks"] if b["forward_tokens"] == D + 1]
    draft_s = (drafter["draft_s"] - drafter["prompt_eval_s"]) / max(drafter["drafted"], 1)
    stale_share = decode["stale_decoded"] / decode["stale"] if decode["stale"] else 1.0
    rebased = (decode["rebased"] / decode["stale_decoded"]) if decode["stale_decoded"] else 0.0
    costs = ChainCosts(draft_s, run["rtt_ms"] / 1e3, statistics.median(full) if full else cloud_token_s, cloud_token_s,
                       stale_share=stale_share, rebased_per_stale_decode=rebased, ahead_limit=ahead_limit)
    chain = pipelined_chain(conditional_alphas(decode), D, W, costs)
    return chain.tokens / chain.seconds


ratios: dict[str, list[float]] = {}
with ExitStack() as stack:
    cloud, link = cloud_behind_link(stack, scen.link, cloud_cores)
    for rung, drafter, _, cat, q, sampling in probe_lines(sys.argv[1].split(",")):
        base = edge(["baseline", "--cloud", link.address, "--drafter", drafter, *sampling])
        cloud_token_s = base["wall_s"] / len(base["tokens"])
        run = edge(["run", "--cloud", link.address, "--drafter", drafter, *sampling, "--schedule", "pipelined",
                    "--draft-len", str(D), "--window", str(W), "--hedge", "0", "--timings"])
        assert run["tokens"] == base["tokens"], (rung, q.question_id)
        measured = len(run["tokens"]) / run["wall_s"]
        before, now = forecast(run, cloud_token_s, 0), forecast(run, cloud_token_s, D + W - 1)
        ratios.setdefault(f"{rung} before", []).append(before / measured)
        ratios.setdefault(f"{rung} with ahead", []).append(now / measured)
        alphas = [round(a, 2) for a in conditional_alphas(run["decode"])]
        print(f"{rung:8s}{cat:11s} #{q.question_id:<4d} cloud-only {1 / cloud_token_s:5.2f}  D{D}W{W} {measured:5.2f} "
              f"tok/s (ahead {run['decode'].get('ahead', '-')}, stale {run['decode']['stale']})  forecast before "
              f"{before:5.2f}  with ahead {now:5.2f}  α {alphas}", flush=True)
for name, values in ratios.items():
    print(f"forecast/measured {name}: median {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
