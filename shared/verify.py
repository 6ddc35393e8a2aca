"""Reference verification for the three modes: slow, obvious, numpy.

Every function takes the drafts of one block, the target's processed
distributions ``p`` [D+1, V] for the block's positions (row i is position
``start_position + i``; the last row serves the bonus token) and, where the
mode needs it, the counters of the randomness. No state, no model calls.
``cloud.verify_torch`` is the fast path and is tested against this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shared.noise import Purpose, exponential, uniform
from shared.sparse import SparseDist

__all__ = ["VerifyResult", "race", "sample_target", "verify_greedy", "verify_coupled", "verify_rejection"]


@dataclass(frozen=True)
class VerifyResult:
    """n accepted drafts, then one correction (n < D) or bonus (n == D) token."""

    accepted: int
    token: int
    bonus: bool


def race(weights: np.ndarray, seed: int, position: int, purpose: int) -> int:
    """argmin_x E(x) / w(x) over w > 0: an exact sample of norm(w).

    ``E(x) = -ln U(seed, position, x, purpose)``. Ties resolve to the lowest id.
    """
    weights = np.asarray(weights, dtype=np.float64)
    noise = exponential(seed, position, np.arange(weights.shape[-1]), purpose)
    with np.errstate(divide="ignore"):
        keys = np.where(weights > 0, noise / weights, np.inf)
    return int(np.argmin(keys))


def sample_target(p: np.ndarray, seed: int, position: int) -> int:
    """Target-only seeded sampling at ``position``: the race on p with SAMPLE noise."""
    return race(p, seed, position, Purpose.SAMPLE)


def _check_block(drafts: np.ndarray, p: np.ndarray) -> None:
    if p.ndim != 2 or p.shape[0] != drafts.shape[0] + 1:
        raise ValueError(f"p must be [D+1, V] for D={drafts.shape[0]} drafts, got {p.shape}")


def verify_greedy(drafts: Sequence[int], p: np.ndarray) -> VerifyResult:
    """Accept while draft == argmax p; then emit argmax p."""
    drafts, p = np.asarray(drafts, dtype=np.int64), np.asarray(p)
    _check_block(drafts, p)
    best = np.argmax(p, axis=-1)
    for i, x in enumerate(drafts):
        if x != best[i]:
            return VerifyResult(i, int(best[i]), bonus=False)
    return VerifyResult(len(drafts), int(best[-1]), bonus=True)


def verify_coupled(drafts: Sequence[int], p: np.ndarray, seed: int, start_position: int) -> VerifyResult:
    """Accept while draft == the target's race winner y_t; at a mismatch emit y_t.

    The committed tokens are exactly target-only seeded sampling's.
    """
    drafts, p = np.asarray(drafts, dtype=np.int64), np.asarray(p)
    _check_block(drafts, p)
    for i, x in enumerate(drafts):
        y = sample_target(p[i], seed, start_position + i)
        if x != y:
            return VerifyResult(i, y, bonus=False)
    return VerifyResult(len(drafts), sample_target(p[-1], seed, start_position + len(drafts)), bonus=True)


def coin_seed(seed: int, coin_key: int) -> int:
    """The seed of rejection mode's ACCEPT and RESIDUAL coins: the session's ``seed`` keyed on the
    cloud's secret ``coin_key`` (0: no key, the seed alone). An edge that knows its coins can steer a
    rejection and its residual sample; one that does not can only shape q̃ (``cloud.limits``:
    ``max_draft_top_k`` bounds what that buys)."""
    return seed ^ coin_key if coin_key else seed


def verify_rejection(
    drafts: Sequence[int], q: Sequence[SparseDist], p: np.ndarray, seed: int, start_position: int,
    coin_key: int = 0,
) -> VerifyResult:
    """Speculative sampling against q̃: accept x with prob min(1, p(x)/q̃(x)).

    On rejection, sample from norm(max(0, p - q̃)) (RESIDUAL noise); after a
    fully accepted block, sample the bonus from p (SAMPLE noise). ACCEPT and
    RESIDUAL noise is keyed on ``coin_key`` (``coin_seed``).
    """
    coins = coin_seed(seed, coin_key)
    drafts, p = np.asarray(drafts, dtype=np.int64), np.asarray(p, dtype=np.float64)
    _check_block(drafts, p)
    if len(q) != len(drafts):
        raise ValueError(f"need one q̃ per draft: {len(q)} for {len(drafts)}")
    for i, x in enumerate(drafts):
        position = start_position + i
        q_x = q[i].prob(int(x))
        if q_x <= 0:
            raise ValueError(f"draft {int(x)} at position {position} is outside its q̃ support")
        u = float(uniform(coins, position, 0, Purpose.ACCEPT))
        if u * q_x < p[i, x]:
            continue
        residual = np.maximum(p[i] - q[i].dense(p.shape[-1]), 0.0)
        return VerifyResult(i, race(residual, coins, position, Purpose.RESIDUAL), bonus=False)
    return VerifyResult(len(drafts), sample_target(p[-1], seed, start_position + len(drafts)), bonus=True)
