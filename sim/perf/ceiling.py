"""The machine's ceiling: the best tokens/s a split could make here, and how close a run came.

From the same run's measurements (``sim.perf.model.Timings``: the drafter's seconds per token, the
verify line by rows, acceptance by position) the ceiling is the steady pipelined rate with every
rejection free: blocks of D drafts leave back to back, enough of them in flight to hide the round trip,
each committing AL(D) tokens on average (``shared.acceptance.expected_acceptance_length``), one every
max(t_verify(D + 1), D * t_draft) seconds, whichever side is slower. The ceiling is the best such rate
over D, and a run's *efficiency* is its tokens/s over it: what a rejection's drained pipeline, stale
blocks, the schedule's choices and the link cost that run, on this machine. A slow machine shows a
low ceiling and a slow design a low efficiency.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.acceptance import expected_acceptance_length
from sim.perf.model import Timings

__all__ = ["Ceiling", "ceiling", "MAX_CEILING_DRAFT_LEN"]

MAX_CEILING_DRAFT_LEN = 16  # draft lengths weighed (the acceptance past the measured ones extrapolated)


@dataclass(frozen=True)
class Ceiling:
    tokens_per_s: float
    draft_len: int  # the D that reaches it
    limited_by: str  # "verify" or "draft": which side sets the pace at that D


def ceiling(timings: Timings, max_draft_len: int = MAX_CEILING_DRAFT_LEN) -> Ceiling | None:
    """The best steady rate over draft lengths 1..``max_draft_len`` (None: no acceptance measured)."""
    alphas = timings.alpha_per_position
    if not alphas:
        return None
    best = None
    for draft_len in range(1, max_draft_len + 1):
        verify_s, draft_s = timings.verify_s(draft_len + 1), draft_len * timings.draft_s_per_token
        interval = max(verify_s, draft_s)
        if interval <= 0:
            continue
        rate = expected_acceptance_length(alphas, draft_len) / interval
        if best is None or rate > best.tokens_per_s:
            best = Ceiling(rate, draft_len, "verify" if verify_s >= draft_s else "draft")
    return best
