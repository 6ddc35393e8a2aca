"""The cloud's audit of rejection-mode drafts: were they drawn from the q̃ sent with them?

Rejection mode is exact only when each draft x was sampled from its q̃; the
cloud accepts x with probability min(1, p(x)/q̃(x)), so an edge that sends a
q̃ which is not the one it sampled from can push tokens of its choosing into
the output. Two checks, pure functions of explicit inputs (the session keeps
the one number of state, the CUSUM statistic):

1. ``unsampled``: the drafter's sampling is a pure function of (seed,
   position, q̃) (``shared.sparse.sampled_indices``, the very rule the edge's
   drafter samples with), so the cloud recomputes which token each q̃ yields
   under the session's DRAFT noise and refuses a draft that is not it. A
   naive forgery (its own token, an honest-looking q̃) never passes.
2. ``surprise`` + ``cusum``: a client that knows the seed can shape q̃ around
   the noise so that its token *is* the sample, with a tiny weight (then
   min(1, p/q̃) accepts it almost surely). The per-draft score is the surprise
   s = -ln q̃(x) less the Rényi-0 (Hartley) entropy ln n of q̃'s n-token
   support: ``score = ln(1 / (n q̃(x)))``. Its exponential e = 1/(n q̃(x)) is
   the likelihood ratio of "x uniform over the support" against "x ~ q̃", so
   E_{x~q̃}[e] = 1 exactly for every q̃: an e-value (the Shannon version
   s - H(q̃) is not one, E[exp(s - H)] = n e^{-H} >= 1). Honest drafts have
   E[score] = H(q̃) - ln n <= 0.

   A one-sided CUSUM, S_t = max(0, S_{t-1} + score_t), ends the session when
   S_t >= ``THRESHOLD``. False alarms: S_t >= h means some window j..t has
   prod e_i >= e^h; each window's product is a nonnegative martingale that
   starts at 1 under honest drafts, so by Ville's inequality it ever reaches
   e^h with probability <= e^-h, and a union over the n start points gives
   P(an honest session is ended) <= n e^-h, whatever the q̃ (adaptive ones
   included). With h = ln(``HORIZON`` / ``FALSE_ALARM``) = ln(2^16 / 1e-4) =
   20.30 nats that is <= 1e-4 for a session of up to 65,536 audited drafts
   (sixteen turns of the default 4,096-token limit; an audited draft commits
   a token, so a session audits at most as many drafts as it generates).
   Detection: a draft with n q̃(x) <= rho adds >= ln(1/rho), so a run of such
   drafts ends the session within ceil(h / ln(1/rho)) of them: q̃(x) <= 2^-8
   with a support of 16 (the default draft_top_k) ends it within 8 drafts, of
   64 within 15, of 128 within 30. No test on (q̃, x) alone can flag a token
   whose q̃ weight is about 1/n (a uniform q̃ is a legitimate one), so the
   bound is stated in n q̃(x).

The checks see only drafts the verification examined (up to and including the
first rejection in a block): each position is then audited once per session,
which is what the martingale argument needs.

Cost: ``audit_block`` + ``cusum`` take about 80 µs a block of 8 drafts with a
64-token q̃ on one CPU core (105 µs at 32 drafts), against 6.3 ms for the
block's ``verify_block`` at V = 262,144.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from shared.sparse import SparseDist, sampled_indices

__all__ = [
    "FALSE_ALARM", "HORIZON", "THRESHOLD", "NOT_SAMPLED", "IMPROBABLE",
    "BlockAudit", "audit_block", "unsampled", "surprise", "cusum", "positions_to_alarm",
]

FALSE_ALARM = 1e-4  # honest sessions ended, at most, per session of up to HORIZON audited drafts
HORIZON = 1 << 16  # audited drafts per session the false-alarm bound covers (n e^-h grows linearly past it)
THRESHOLD = math.log(HORIZON / FALSE_ALARM)  # h = 20.30 nats

NOT_SAMPLED = "draft not sampled from its q̃"  # the refusal's message starts so (check 1)
IMPROBABLE = "drafts improbable under the q̃ sent with them"  # ... and so (check 2)


class BlockAudit(NamedTuple):
    """Both checks' inputs for one block, from one pass over its q̃."""

    unsampled: int | None  # offset of the first draft that is not the token its q̃ yields; None: all are
    scores: np.ndarray  # [D] float64 ln(1 / (n q̃(x))) per draft (``surprise``), up to ``unsampled``


def audit_block(drafts: Sequence[int], q: Sequence[SparseDist], seed: int, start_position: int) -> BlockAudit:
    """Audit a block: which token each q̃ yields under the DRAFT noise at its position (draft ``i`` at
    ``start_position + i``), the first draft that is not it, and the drafts' scores. Vectorised over
    the block; no loop over tokens."""
    if len(q) != len(drafts):
        raise ValueError(f"need one q̃ per draft: {len(q)} for {len(drafts)}")
    if not len(drafts):
        return BlockAudit(None, np.zeros(0))
    index = sampled_indices(q, seed, start_position)  # [D]
    sizes = np.fromiter((dist.support.size for dist in q), dtype=np.int64, count=len(q))
    at = np.cumsum(sizes) - sizes + index  # [D] the draws' places in the block's flat support
    drawn = np.concatenate([dist.support for dist in q])[at]
    weight = np.concatenate([dist.weights for dist in q])[at]
    bad = np.flatnonzero(drawn != np.asarray(drafts, dtype=np.int64))
    total = np.ldexp(1.0, np.fromiter((dist.prob_bits for dist in q), dtype=np.int64, count=len(q)))
    return BlockAudit(int(bad[0]) if bad.size else None, np.log(total / (weight * sizes)))


def unsampled(drafts: Sequence[int], q: Sequence[SparseDist], seed: int, start_position: int) -> int | None:
    """The offset of the first draft that is not the token its q̃ yields under the DRAFT noise at its
    position (draft ``i`` at ``start_position + i``); None when every draft is."""
    return audit_block(drafts, q, seed, start_position).unsampled


def surprise(drafts: Sequence[int], q: Sequence[SparseDist]) -> np.ndarray:
    """Per draft, ``ln(1 / (n q̃(x)))`` [D]: its surprise -ln q̃(x) less ln n (n: q̃'s support size),
    for any drafts in their supports (``audit_block`` scores the draws alone, from the same pass).

    ``exp(score)`` has expectation 1 under x ~ q̃. A draft outside its support is a ``ValueError``.
    """
    if len(q) != len(drafts):
        raise ValueError(f"need one q̃ per draft: {len(q)} for {len(drafts)}")
    if not len(drafts):
        return np.zeros(0)
    sizes = np.fromiter((dist.support.size for dist in q), dtype=np.int64, count=len(q))
    support = np.concatenate([dist.support for dist in q])
    weights = np.concatenate([dist.weights for dist in q])
    row = np.repeat(np.arange(len(q)), sizes)
    hit = support == np.asarray(drafts, dtype=np.int64)[row]
    weight = np.bincount(row, weights=np.where(hit, weights, 0), minlength=len(q))  # [D] integer weight of x
    if (weight == 0).any():
        raise ValueError(f"draft at offset {int(np.flatnonzero(weight == 0)[0])} is outside its q̃ support")
    total = np.array([float(1 << dist.prob_bits) for dist in q])
    return np.log(total) - np.log(weight) - np.log(sizes)


def cusum(statistic: float, scores: np.ndarray, threshold: float = THRESHOLD) -> tuple[float, int | None]:
    """One-sided CUSUM S_t = max(0, S_{t-1} + score_t) from ``statistic`` over ``scores`` [D]:
    (the statistic after them, the offset of the first score at which S_t >= ``threshold`` or None)."""
    scores = np.asarray(scores, dtype=np.float64)
    if not scores.size:
        return statistic, None
    # Lindley's recursion in closed form: S_t = C_t - min(-S_0, min_{j<=t} C_j), C the running sum.
    running = np.cumsum(scores)
    path = running - np.minimum(np.minimum.accumulate(running), -statistic)
    crossed = np.flatnonzero(path >= threshold)
    return float(path[-1]), (int(crossed[0]) if crossed.size else None)


def positions_to_alarm(rho: float, threshold: float = THRESHOLD) -> int:
    """How many consecutive drafts with n q̃(x) <= ``rho`` (< 1) end a session from S = 0 at most."""
    return math.ceil(threshold / math.log(1 / rho))
