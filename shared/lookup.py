"""Prompt lookup: what followed the latest earlier occurrence of a sequence's last tokens.

One home for the proposer both ends use: the edge's model-free drafters
(``edge.ngram_drafter``, ``edge.lookup_drafter``) and the verifier, which fills
the rows its forward holds anyway with its own proposals while it decodes alone
(``cloud.session``). A proposal is only ever a draft: the target verifies it.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["MAX_NGRAM", "MIN_NGRAM", "lookup_continuation"]

MAX_NGRAM = 4  # the longest suffix looked up (tried first)
MIN_NGRAM = 2  # the shortest: one token repeats too often to predict what follows it


def lookup_continuation(seq: Sequence[int], n: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> list[int]:
    """Up to ``n`` tokens that followed the latest earlier occurrence of ``seq``'s last ``size`` tokens,
    for the first ``size`` from ``max_ngram`` down to ``min_ngram`` that occurred before with a
    non-empty continuation; [] when none did. O(len(seq)) per size: a scan from the end that compares
    a suffix only where its last token matches."""
    if n <= 0:
        return []
    for size in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        suffix = list(seq[-size:])
        last = suffix[-1]
        for start in range(len(seq) - size - 1, -1, -1):  # latest first
            if seq[start + size - 1] == last and list(seq[start : start + size]) == suffix:
                return list(seq[start + size : start + size + n])
    return []
