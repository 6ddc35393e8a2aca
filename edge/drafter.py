"""The drafter lifecycle shared by every proposer, and the per-mode proposal rule.

A drafter is driven as ``begin(prompt, params)``, then rounds of
``draft(n)`` and ``commit(tokens)``, then ``close()`` (llama.cpp's
``begin / draft / accept`` shape). ``commit`` receives the tokens the
verifier committed; the drafter rolls back whatever it speculated past them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from shared.logits import top_candidates
from shared.noise import Purpose, exponential
from shared.params import SamplingParams
from shared.sparse import SparseDist, quantize, sample_sparse

__all__ = ["DraftBlock", "Drafter", "propose", "one_hot_block"]

# How many of the drafter's highest logits a proposal looks at. The choice
# never affects losslessness, only acceptance; q̃ keeps at most draft_top_k.
CANDIDATES = 64


@dataclass(frozen=True)
class DraftBlock:
    tokens: list[int]  # [n] proposed ids, positions start_position .. start_position + n - 1
    q: list[SparseDist] | None = None  # [n] q̃ per token, rejection mode only


class Drafter(Protocol):
    """What the decode loop needs from a proposer."""

    vocab_size: int

    def begin(self, prompt: Sequence[int], params: SamplingParams) -> None:
        """Start a sequence; ``prompt`` is the committed prefix."""

    def draft(self, n: int) -> DraftBlock:
        """Propose up to ``n`` tokens continuing the committed prefix (may return fewer)."""

    def commit(self, tokens: Sequence[int]) -> None:
        """Append the verifier's committed tokens and drop the rest of the speculation."""

    def close(self) -> None:
        """Release native resources."""


def propose(logits: np.ndarray, params: SamplingParams, position: int) -> tuple[int, SparseDist | None]:
    """The drafter's token at ``position`` from its logits [V], per mode.

    greedy (temperature 0, any mode): argmax q. coupled: the exponential race on q with the same SAMPLE
    noise the target uses, so the draft equals the target's token whenever q
    and p pick the same winner. rejection: an exact sample from q̃, returned
    with q̃ so the verifier can use it.
    """
    if params.is_greedy:
        return int(np.argmax(logits)), None
    if params.sends_q:
        ids, probs = top_candidates(logits, params, limit=max(CANDIDATES, params.draft_top_k))
        q = quantize(probs, params.draft_top_k, params.prob_bits, ids=ids)
        return sample_sparse(q, params.seed, position), q
    ids, probs = top_candidates(logits, params, limit=CANDIDATES)
    keys = exponential(params.seed, position, ids, Purpose.SAMPLE) / probs
    return int(ids[np.argmin(keys)]), None


def _one_hot(token: int, params: SamplingParams) -> SparseDist:
    return SparseDist(np.array([token]), np.array([1 << params.prob_bits]), params.prob_bits)


def one_hot_block(tokens: Sequence[int], params: SamplingParams) -> DraftBlock:
    """A block of deterministic proposals; in rejection mode each carries a point-mass q̃."""
    tokens = [int(t) for t in tokens]
    q = [_one_hot(t, params) for t in tokens] if params.sends_q else None
    return DraftBlock(tokens, q)
