"""Prompt-lookup drafting: propose what followed the latest earlier occurrence
of the sequence's trailing n-gram. No model; cheap on any device; shines on
inputs that repeat (code edits, extraction, summaries quoting the prompt).
"""

from __future__ import annotations

from edge.drafter import DraftBlock, ModelFreeDrafter, one_hot_block
from shared.lookup import lookup_continuation

__all__ = ["NgramDrafter"]


class NgramDrafter(ModelFreeDrafter):
    """``Drafter`` that copies continuations from the sequence's own history.

    Tries n-gram sizes from ``max_ngram`` down to ``min_ngram``; proposes
    nothing when no earlier match exists (the round is then target-only).
    In rejection mode each proposal carries a point-mass q̃.
    """

    def __init__(self, vocab_size: int, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        super().__init__(vocab_size)
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def propose_block(self, n: int) -> DraftBlock:
        return one_hot_block(lookup_continuation(self._spec.tokens, n, self.max_ngram, self.min_ngram), self._params)
