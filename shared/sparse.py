"""The sparse quantized draft distribution q̃ used by rejection mode.

q̃ keeps the top-k tokens of the drafter's q, with probabilities stored as
positive integers that sum exactly to ``2**prob_bits``. Tokens whose share
rounds to zero leave the support, so a peaked q costs only a few entries on
the wire. The drafter samples from q̃ itself (not from q) with counter noise,
and the cloud verifies against the same q̃, which keeps rejection sampling
exact whatever the rounding did.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shared.noise import Purpose, uniform_bits

__all__ = [
    "SparseDist", "quantize", "draft_noise", "sampled_indices", "sample_sparse", "DEFAULT_TOP_K", "DEFAULT_PROB_BITS",
]

DEFAULT_TOP_K = 16
DEFAULT_PROB_BITS = 8
MAX_PROB_BITS = 16


@dataclass(frozen=True)
class SparseDist:
    """q̃ at one position. Invariants are checked on construction."""

    support: np.ndarray  # [n] int64, distinct token ids, n >= 1
    weights: np.ndarray  # [n] int64 >= 1, sum == 2**prob_bits
    prob_bits: int

    def __post_init__(self) -> None:
        support = np.asarray(self.support, dtype=np.int64)
        weights = np.asarray(self.weights, dtype=np.int64)
        object.__setattr__(self, "support", support)
        object.__setattr__(self, "weights", weights)
        if not 1 <= self.prob_bits <= MAX_PROB_BITS:
            raise ValueError(f"prob_bits must be in [1, {MAX_PROB_BITS}], got {self.prob_bits}")
        if support.ndim != 1 or support.shape != weights.shape or support.size == 0:
            raise ValueError("q̃ needs one weight per support token and at least one token")
        if (weights < 1).any() or int(weights.sum()) != 1 << self.prob_bits:
            raise ValueError(f"q̃ weights must be >= 1 and sum to 2**{self.prob_bits}")
        if np.unique(support).size != support.size:
            raise ValueError("q̃ support has repeated tokens")

    def prob(self, token: int) -> float:
        """q̃(token) as a float; 0 outside the support."""
        hit = np.flatnonzero(self.support == token)
        return float(self.weights[hit[0]]) / (1 << self.prob_bits) if hit.size else 0.0

    def dense(self, vocab_size: int) -> np.ndarray:
        """q̃ as a dense float64 vector [vocab_size]."""
        out = np.zeros(vocab_size, dtype=np.float64)
        out[self.support] = self.weights / float(1 << self.prob_bits)
        return out


def quantize(
    probs: np.ndarray,
    top_k: int = DEFAULT_TOP_K,
    prob_bits: int = DEFAULT_PROB_BITS,
    ids: np.ndarray | None = None,
) -> SparseDist:
    """Quantize a distribution to q̃ with at most ``top_k`` entries.

    ``probs`` [n] are the probabilities of tokens ``ids`` [n] (default: the
    dense vector over the whole vocabulary). Largest-remainder rounding of the
    renormalised top-k mass to integers summing to ``2**prob_bits``; entries
    that round to zero are dropped. Support is ordered by decreasing weight.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    probs = np.asarray(probs, dtype=np.float64)
    ids = np.arange(probs.size) if ids is None else np.asarray(ids, dtype=np.int64)
    k = min(top_k, probs.size)
    top = np.argpartition(-probs, k - 1)[:k] if k < probs.size else np.arange(probs.size)
    top = top[probs[top] > 0]
    if top.size == 0:
        raise ValueError("q has no positive mass")
    mass = probs[top]
    total = 1 << prob_bits
    scaled = mass / mass.sum() * total
    weights = np.floor(scaled).astype(np.int64)
    short = total - int(weights.sum())
    if short > 0:
        # Hand the rounding remainder to the largest fractional parts (ties: larger mass).
        order = np.lexsort((-mass, -(scaled - weights)))
        weights[order[:short]] += 1
    keep = weights > 0
    support, weights = ids[top[keep]], weights[keep]
    order = np.lexsort((support, -weights))
    return SparseDist(support=support[order], weights=weights[order], prob_bits=prob_bits)


def draft_noise(seed: int, position, prob_bits: int) -> np.ndarray:
    """The DRAFT noise at ``position`` (int or array): a ``prob_bits``-bit uniform integer r."""
    return uniform_bits(seed, position, 0, Purpose.DRAFT, prob_bits)


def sampled_indices(q: Sequence[SparseDist], seed: int, start_position: int) -> np.ndarray:
    """Where in each q̃'s support the drafter's sample falls: [D] indices, q̃ ``i`` at ``start_position + i``.

    The one sampling rule of rejection mode, for the drafter and for the cloud's
    audit alike: the DRAFT noise r at the position picks the first token whose
    cumulative weight (in the support's order) exceeds r, so P(token) =
    weight / 2**prob_bits exactly. Vectorised over the block (no loop over
    tokens); the q̃ of one block share one ``prob_bits``.
    """
    if not q:
        return np.zeros(0, dtype=np.int64)
    prob_bits = q[0].prob_bits
    if any(dist.prob_bits != prob_bits for dist in q):
        raise ValueError("the q̃ of one block must share one prob_bits")
    sizes = np.fromiter((dist.weights.size for dist in q), dtype=np.int64, count=len(q))
    cumulative = np.cumsum(np.concatenate([dist.weights for dist in q]))  # [sum(sizes)], across rows
    ends = np.cumsum(sizes)
    before = np.concatenate(([0], cumulative[ends[:-1] - 1]))  # [D] weight of the rows before each
    r = draft_noise(seed, start_position + np.arange(len(q)), prob_bits)  # [D]
    row = np.repeat(np.arange(len(q)), sizes)
    # searchsorted(cumsum(weights), r, side="right") per row: the count of entries with cum <= r
    return np.bincount(row, weights=cumulative - before[row] <= r[row], minlength=len(q)).astype(np.int64)


def sample_sparse(dist: SparseDist, seed: int, position: int) -> int:
    """Exact sample from q̃ with the DRAFT noise at ``position`` (``sampled_indices`` of one q̃)."""
    return int(dist.support[sampled_indices([dist], seed, position)[0]])
