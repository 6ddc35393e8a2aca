"""Logit processing: temperature, top-k, top-p; temperature 0 is greedy.

``process_logits`` is the exact reference used by verification (``p``).
``top_candidates`` is the drafter's cheap sparse version (``q``): it only
looks at the highest logits, which is safe because no mode's losslessness
depends on how the drafter arrives at its proposal or at q̃.
"""

from __future__ import annotations

import numpy as np

from shared.params import SamplingParams

__all__ = ["process_logits", "top_candidates", "CANDIDATE_GAP"]

CANDIDATE_GAP = 16.0  # drafter candidates lie within this many temperatures of the best logit


def _filter_top_p(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Zero the tail outside the smallest set whose mass reaches top_p. probs: [..., V]."""
    order = np.argsort(-probs, axis=-1, kind="stable")
    sorted_probs = np.take_along_axis(probs, order, axis=-1)
    before = np.cumsum(sorted_probs, axis=-1) - sorted_probs  # mass strictly before each token
    keep_sorted = before < top_p
    keep = np.empty_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    return np.where(keep, probs, 0.0)


def process_logits(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Logits [..., V] -> float64 probabilities [..., V] under ``params``.

    Order: temperature, top-k (ties at the k-th value are kept), softmax,
    top-p, renormalise. Temperature 0 returns one-hot at the first argmax.
    """
    logits = np.asarray(logits, dtype=np.float64)
    if params.is_greedy:
        out = np.zeros_like(logits)
        np.put_along_axis(out, np.argmax(logits, axis=-1)[..., None], 1.0, axis=-1)
        return out
    scaled = logits / params.temperature
    if 0 < params.top_k < scaled.shape[-1]:
        kth = -np.partition(-scaled, params.top_k - 1, axis=-1)[..., params.top_k - 1 : params.top_k]
        scaled = np.where(scaled >= kth, scaled, -np.inf)
    scaled = scaled - scaled.max(axis=-1, keepdims=True)
    probs = np.exp(scaled)
    probs /= probs.sum(axis=-1, keepdims=True)
    if params.top_p < 1.0:
        probs = _filter_top_p(probs, params.top_p)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def top_candidates(logits: np.ndarray, params: SamplingParams, limit: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """The drafter's q restricted to at most ``limit`` of its highest logits.

    logits: [V] -> (ids [n] int64, probs [n] float64 summing to 1), ordered by
    decreasing probability. Tokens more than ``CANDIDATE_GAP`` (in units of
    temperature) below the best logit are never candidates: their q relative
    to the best is below e^-16. That makes the usual case one pass over V
    instead of a partial sort.
    """
    logits = np.asarray(logits)
    if params.is_greedy:
        return np.array([int(np.argmax(logits))], dtype=np.int64), np.ones(1)
    n = min(limit, logits.shape[-1])
    if params.top_k:
        n = min(n, params.top_k)
    ids = np.flatnonzero(logits >= logits.max() - CANDIDATE_GAP * params.temperature)
    if ids.size > n:
        ids = ids[np.argpartition(-logits[ids], n - 1)[:n]]
    ids = ids[np.argsort(-logits[ids], kind="stable")]
    probs = process_logits(logits[ids], SamplingParams(temperature=params.temperature, top_p=params.top_p))
    keep = probs > 0
    return ids[keep].astype(np.int64), probs[keep]
