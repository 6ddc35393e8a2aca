"""The machine's ceiling: the best tokens/s a split could make here, and how close a run came.

From the same run's measurements (``sim.perf.model.Timings``: the drafter's seconds per token, the
verify line by rows, acceptance by position) the ceiling is the steady pipelined rate with every
rejection free: blocks of D drafts leave back to back, enough of them in flight to hide the round trip,
each committing AL(D) tokens on average (``shared.acceptance.expected_acceptance_length``), one every
max(t_verify(D + 1), D * t_draft) seconds, whichever side is slower. The ceiling is the best such rate
over D, the cloud alone (D = 0: a forward a token) included, and a run's *efficiency* is its tokens/s
over it: what a rejection's drained pipeline, stale blocks, the schedule's choices and the link cost
that run, on this machine. A slow machine shows a low ceiling and a slow design a low efficiency.

Per prompt (``per_prompt_efficiency``), what a target stated as a median over prompts reads: each
prompt's ceiling on its own acceptance, against that prompt's rate after its first token
(``steady_rate``: the prefill and the first token are the same for any schedule), and, where the
performance model's best schedule for the prompt is known (rejections paid: a drained pipeline per
correction, stale blocks), how much of the ceiling that schedule leaves (what the design allows) and how
much of it the run made (what the controller and the implementation lose). Medians over prompts: a
pooled acceptance over prompts overstates the deep positions (only the easy prompts reach them) and so
the pooled ceiling.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from shared.acceptance import expected_acceptance_length
from sim.perf.model import Timings

__all__ = ["Ceiling", "ceiling", "MAX_CEILING_DRAFT_LEN", "steady_rate", "per_prompt_efficiency"]

MAX_CEILING_DRAFT_LEN = 16  # draft lengths weighed (the acceptance past the measured ones extrapolated)


@dataclass(frozen=True)
class Ceiling:
    tokens_per_s: float
    draft_len: int  # the D that reaches it (0: the cloud alone, where no drafting beats it)
    limited_by: str  # "verify" or "draft": which side sets the pace at that D


def ceiling(timings: Timings, max_draft_len: int = MAX_CEILING_DRAFT_LEN) -> Ceiling | None:
    """The best steady rate over draft lengths 0..``max_draft_len`` (0: the cloud decoding alone, a
    forward a token; None: no acceptance measured)."""
    alphas = timings.alpha_per_position
    if not alphas:
        return None
    alone = timings.verify_s(1)  # the cloud decoding alone: a schedule a split may choose (D = 0)
    best = Ceiling(1.0 / alone, 0, "verify") if alone > 0 else None
    for draft_len in range(1, max_draft_len + 1):
        verify_s, draft_s = timings.verify_s(draft_len + 1), draft_len * timings.draft_s_per_token
        interval = max(verify_s, draft_s)
        if interval <= 0:
            continue
        rate = expected_acceptance_length(alphas, draft_len) / interval
        if best is None or rate > best.tokens_per_s:
            best = Ceiling(rate, draft_len, "verify" if verify_s >= draft_s else "draft")
    return best


def steady_rate(tokens: int, wall_s: float, ttft_s: float) -> float | None:
    """Tokens/s after the first token (None: fewer than two tokens, or no time after the first)."""
    if tokens < 2 or wall_s <= ttft_s:
        return None
    return (tokens - 1) / (wall_s - ttft_s)


def per_prompt_efficiency(steady: list[float | None], ceilings: list[float | None],
                          best: list[float] | None = None) -> dict | None:
    """Over the prompts with a steady rate and a ceiling: the median, least and most of steady / ceiling
    (``efficiency``), and where ``best`` (per prompt, the best schedule's predicted steady rate) is
    given, the medians of best / ceiling (``best_schedule``) and of steady / best (``of_best_schedule``).
    None when no prompt has both."""
    kept = [i for i, (s, c) in enumerate(zip(steady, ceilings)) if s and c]
    if not kept:
        return None
    shares = [steady[i] / ceilings[i] for i in kept]
    out = {"median": statistics.median(shares), "min": min(shares), "max": max(shares), "prompts": len(kept),
           "best_schedule": None, "of_best_schedule": None}
    if best is not None:
        paired = [i for i in kept if best[i] > 0]
        if paired:
            out["best_schedule"] = statistics.median(best[i] / ceilings[i] for i in paired)
            out["of_best_schedule"] = statistics.median(steady[i] / best[i] for i in paired)
    return out
