"""Modelled capacity: sessions per verifier at a per-session SLO, split against cloud-only, both batched.

With N sessions sharing every forward (the scheduler packs what all of them
wait for), a forward over R rows of N sessions costs ``HardwareProfile.batch_forward_s(R, N)``
(a roofline: memory-bound until the ridge point). Cloud-only: each forward
carries one row per session, so each session gets one token per forward.
Split: each forward carries D+1 rows per session (more where a session's
pending blocks are verified together or a stale block's forward verifies
rebased drafts, each row at what it adds to the packed forward); a session's
rate is the pipelined model's (``predict_pipelined``) with that shared
forward as its verify time, at the best D (or cloud decoding alone where that
is faster, as the adaptive schedule would choose). Cloud time per token
divides the forward by the N sessions sharing it. Every session is assumed to
wait for the same forward: an upper bound on batching, labelled MODELLED.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from shared.params import DEFAULT_WINDOW
from sim.perf.hardware_profile import HardwareProfile
from sim.perf.model import (
    NetworkModel,
    Prediction,
    fastest_then_cheapest,
    predict_cloud_only,
    predict_pipelined,
)

__all__ = ["capacity_rows", "capacity_at_slo", "DEFAULT_SESSION_COUNTS"]

DEFAULT_SESSION_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def _batched(profile: HardwareProfile, sessions: int, rows_per_session: int):
    """The profile's timings with every verify being one packed forward shared by ``sessions``: ``rows_per_session``
    rows each cost that forward, and each row a session adds (blocks verified together, rebased drafts) what one
    row more adds to it (the per-row cost; the fixed part too once the forward is compute-bound): one session's
    rows at a time, not every session's at once (that would add ``sessions`` rows, an upper bound)."""
    forward = profile.batch_forward_s(sessions * rows_per_session, sessions)
    per_row = profile.batch_forward_s(sessions * rows_per_session + 1, sessions) - forward
    return dataclasses.replace(profile.to_timings(), verify_fixed_s=forward - per_row * rows_per_session,
                               verify_per_token_s=per_row, verify_one_s=profile.batch_forward_s(sessions, sessions))


def _drafting(profile: HardwareProfile, link: NetworkModel, sessions: int, max_draft_len: int, window: int) -> Prediction:
    """The best pipelined split with drafting (D >= 1) when ``sessions`` share each forward (among the
    nearly as fast, the least cloud compute)."""
    return fastest_then_cheapest(
        [predict_pipelined(_batched(profile, sessions, d + 1), link, d, window) for d in range(1, max_draft_len + 1)])


def capacity_rows(profile: HardwareProfile, link: NetworkModel, sessions=DEFAULT_SESSION_COUNTS,
                  max_draft_len: int = 16, window: int = DEFAULT_WINDOW) -> list[dict[str, Any]]:
    """Per N: cloud-only and split per-session tokens/s, aggregate, cloud seconds per token, chosen D."""
    rows = []
    for n in sessions:
        base = predict_cloud_only(_batched(profile, n, 1), link)
        drafting = _drafting(profile, link, n, max_draft_len, window)
        split = drafting if drafting.tokens_per_s > base.tokens_per_s else base  # adaptive: the cloud alone
        rows.append({
            "sessions": n,
            "cloud_only_tokens_per_s": base.tokens_per_s,
            "split_tokens_per_s": split.tokens_per_s,
            "cloud_only_aggregate": n * base.tokens_per_s,
            "split_aggregate": n * split.tokens_per_s,
            "cloud_only_cloud_s_per_token": base.cloud_s_per_token / n,
            "split_cloud_s_per_token": split.cloud_s_per_token / n,
            "split_draft_len": split.draft_len,
            "forward_rows": n * (split.draft_len + 1),
            "drafting_tokens_per_s": drafting.tokens_per_s,  # the split kept drafting (best D >= 1)
            "drafting_cloud_s_per_token": drafting.cloud_s_per_token / n,
            "drafting_draft_len": drafting.draft_len,
        })
    return rows


def capacity_at_slo(rows: list[dict[str, Any]], slo: float) -> dict[str, Any]:
    """Largest N meeting ``slo`` tokens/s per session for each mode, and the first N where the
    split stops paying (its per-session rate no better than cloud-only's, or it decodes alone)."""
    def largest(key: str) -> int:
        return max((r["sessions"] for r in rows if r[key] >= slo), default=0)



    stops = next((r["sessions"] for r in rows
                  if r["split_draft_len"] == 0 or r["split_tokens_per_s"] <= r["cloud_only_tokens_per_s"]), None)
    return {"slo_tokens_per_s": slo, "cloud-only": largest("cloud_only_tokens_per_s"),
            "split": largest("split_tokens_per_s"), "split_drafting": largest("drafting_tokens_per_s"),
            "split_stops_paying_at": stops}
