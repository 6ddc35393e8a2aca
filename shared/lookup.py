"""Prompt lookup: what followed the latest earlier occurrence of a sequence's last tokens.

One home for the proposer both ends use: the edge's model-free drafters
(``edge.ngram_drafter``, ``edge.lookup_drafter``) and the verifier, which fills
the rows its forward holds anyway with its own proposals while it decodes alone
(``cloud.session``). A proposal is only ever a draft: the target verifies it.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["MAX_NGRAM", "MIN_NGRAM", "WINDOW", "lookup_continuation"]

MAX_NGRAM = 4  # the longest suffix looked up (tried first)
MIN_NGRAM = 2  # the shortest: one token repeats too often to predict what follows it
WINDOW = 4096  # the verifier's search: the latest tokens (a lookup costs at most this many steps per suffix size)


def lookup_continuation(seq: Sequence[int], n: int, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM,
                        window: int | None = None) -> list[int]:
    """Up to ``n`` tokens that followed the latest earlier occurrence, among ``seq``'s last ``window``
    tokens (None: all of them), of its last ``size`` tokens, for the first ``size`` from ``max_ngram``
    down to ``min_ngram`` that occurred there with a non-empty continuation; [] when none did.
    O(window) per size: a scan from the end that compares a suffix only where its last token matches
    (the edge searches its whole sequence; the verifier, on its engine thread, ``WINDOW``)."""
    if n <= 0:
        return []
    first = 0 if window is None else max(len(seq) - window, 0)
    for size in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        suffix = list(seq[-size:])
        last = suffix[-1]
        for start in range(len(seq) - size - 1, first - 1, -1):  # latest first
            if seq[start + size - 1] == last and list(seq[start : start + size]) == suffix:
                return list(seq[start + size : start + size + n])
    return []
