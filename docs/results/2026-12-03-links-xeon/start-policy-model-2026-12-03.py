"""Sim-model experiment (2026-12-03, commit 7c92514): what the adaptive controller's start costs 64- and 256-token
generations, per link and drafter, starting drafting (as sessions do) or with the cloud alone. Timings from the
satellite run's fit (links-2026-12-03-satellite.md, in git history at b2b5c1c), a flat α per drafter. Run from the repository root:
.venv/bin/python docs/results/2026-12-03-links-xeon/start-policy-model-2026-12-03.py; its output: start-policy-model-2026-12-03.txt."""

from edge.controller import Controller
from edge.link_windows import CLOUD_WINDOW
from sim.link.scenario import load_scenario
from sim.perf.block_sim import simulate_adaptive
from sim.perf.model import NetworkModel, Timings, _block_costs, _simulated, predict_cloud_only


def timings(alpha):
    return Timings(draft_s_per_token=0.0313, verify_fixed_s=0.1255, verify_per_token_s=0.00538, alpha_per_position=[alpha]*8,
                   up_bytes_fixed=20.2, up_bytes_per_draft=2.78, down_bytes_per_round=35.9, down_bytes_per_token_cloud_only=23.1,
                   prefill_s=0.222, verify_one_s=0.0894)

class StartAlone(Controller):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.draft_len = 0

def run(t, link, cls, tokens=64):
    costs = _block_costs(t, link, 8)
    r = simulate_adaptive(costs, lambda: cls(8, 4, CLOUD_WINDOW), tokens, 64)
    return _simulated(t, link, r).tokens_per_s

for name in ("acespec-50k", "lte", "wan", "satellite"):
    link = NetworkModel.from_link_config(load_scenario(name).link)
    for drafter, alpha in (("gemma", 0.85), ("q3_k_s", 0.5), ("q2_k", 0.55), ("bad", 0.2)):
        t = timings(alpha)
        cloud = predict_cloud_only(t, link).tokens_per_s
        a, b = run(t, link, Controller), run(t, link, StartAlone)
        a256, b256 = run(t, link, Controller, 256), run(t, link, StartAlone, 256)
        print(f"{name:12s} {drafter:7s} cloud {cloud:5.2f}  start-drafting {a/cloud:.2f}x  start-alone {b/cloud:.2f}x   | 256 tok: {a256/cloud:.2f}x {b256/cloud:.2f}x", flush=True)
