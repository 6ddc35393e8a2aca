"""What the controller's own model prices a faster drafter at: the best chain (D = 1..8, 4 in flight) with
the category run's conditional acceptance (a lower bound on α per position), acespec-50k's trip, two
verify costs, three drafting costs."""
import json
from pathlib import Path

from edge.controller import Controller

result = json.loads((Path(__file__).parent / "categories_head_q4_0.json").read_text())
for rung in ("default", "q2_k"):
    rates = result["drafters"][rung]["all"]["conditional_acceptance_rate"]
    # (SPEED-Bench's rates from the accept-length histogram: "1" is the step's own token, always 1; the
    # drafts' follow. Blocks cut short by the adaptive schedule read as misses, so these understate α.)
    alphas = [rates[k] for k in sorted(rates, key=int) if k != "1"]
    print(rung, [round(x, 2) for x in alphas])
    for verify_s in (0.055, 0.070):
        row = []
        for draft_s in (0.0127, 0.0100, 0.0070):
            controller = Controller.converged(8, 4, alpha_per_position=alphas, draft_s_per_token=draft_s,
                                              network_s=0.12, forward_s=verify_s, cloud_s_per_token=0.053)
            rate, draft_len = max((controller.predict_drafting(d) or 0, d) for d in range(1, 9))
            row.append(f"draft {draft_s * 1e3:.1f} ms: {rate:.1f} tok/s D={draft_len}")
        print(f"  verify {verify_s * 1e3:.0f} ms:", "; ".join(row))
