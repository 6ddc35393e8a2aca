"""Prompt lookup first, the model drafter for the rest: drafts that cost the edge nothing where the
text repeats itself (code edits, quoting, multi-turn chats), the model's everywhere else.

``LookupFirstDrafter(model)`` is a ``Drafter``. Each block starts with the
continuation of the latest earlier occurrence of the sequence's last tokens
(``shared.lookup.lookup_continuation`` over the prompt, the
conversation and everything generated or speculated so far) when there is
one *and* lookup proposals have been accepted at least as often as the
model's; the model drafts the rest of the block after them (llama.cpp reads
the looked-up tokens in one batch on its next draft). Each source's
acceptance is measured at commit time as a block's is verified (each chain of
its proposals up to its first miss, on the right prefix only); a lookup
candidate the block did not use is scored too (a shadow), so a source that
fell behind can win back. Lookup proposals
carry a point-mass q̃ in rejection mode (an exact draw from it) and no
runner-up (no hedge hangs on them). Losslessness never depends on any of
this: the verifier decides every token.

Contract. The model drafter must expose ``sequence`` (its committed and
speculated tokens, read-only) and ``speculate(tokens)`` (append proposals made
elsewhere to its speculation); every other attribute (``vocab``,
``model_name``, ...) is the model drafter's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edge.drafter import DraftBlock, common_prefix_length, one_hot_block
from shared.lookup import MAX_NGRAM, MIN_NGRAM, lookup_continuation
from shared.params import SamplingParams

__all__ = ["LookupFirstDrafter", "SourceAcceptance"]

LOOKUP, MODEL = "lookup", "model"


@dataclass
class SourceAcceptance:
    """Proposals of one source scored against the committed tokens."""

    proposed: int = 0
    accepted: int = 0

    @property
    def rate(self) -> float:
        """Accepted per proposed, with one accepted and one rejected before any (Laplace)."""
        return (self.accepted + 1) / (self.proposed + 2)


@dataclass
class _Chain:
    """Consecutive proposals of one source from ``start`` on; scored up to ``next``."""

    source: str
    start: int
    tokens: list[int]
    next: int


class LookupFirstDrafter:
    """``Drafter``: a prompt-lookup continuation first while it pays, ``model`` for the rest (see the
    module docstring). ``max_ngram`` / ``min_ngram``: the suffix lengths looked up, longest first (a
    one-token match predicts little, so the shortest is two by default)."""

    def __init__(self, model, *, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.model = model
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.acceptance = {LOOKUP: SourceAcceptance(), MODEL: SourceAcceptance()}
        self.looked_up = 0  # drafts the lookup supplied, cumulative
        self._params = SamplingParams()
        self._committed = 0  # tokens the verifier committed, prompt included
        self._chains: list[_Chain] = []  # proposals not yet scored, drafted or shadow

    def __getattr__(self, name: str):
        if name == "model":  # (not set yet: no recursion)
            raise AttributeError(name)
        return getattr(self.model, name)  # vocab, model_name, stats, ... (only what this class lacks)

    @property
    def lookup_pays(self) -> bool:
        """Whether lookup proposals have been accepted at least as often as the model's."""
        return self.acceptance[LOOKUP].rate >= self.acceptance[MODEL].rate

    # -- the Drafter lifecycle ---------------------------------------------
    def begin(self, prompt: Sequence[int], params: SamplingParams) -> None:
        self.model.begin(prompt, params)
        self._params, self._committed, self._chains = params, len(prompt), []

    def draft(self, n: int, stop: Callable[[], bool] | None = None) -> DraftBlock:
        started = time.perf_counter()
        seq = self.model.sequence
        start = len(seq)
        found = lookup_continuation(seq, n, self.max_ngram, self.min_ngram)
        self._note(LOOKUP, start, found)
        if not found or not self.lookup_pays:
            block = self.model.draft(n, stop)
            self._note(MODEL, start, block.tokens)
            return block
        self.model.speculate(found)
        self.looked_up += len(found)
        block = one_hot_block(found, self._params)
        block = DraftBlock(block.tokens, block.q, [None] * len(found), [None] * len(found))
        self.model.stats.record_draft(len(found), time.perf_counter() - started)
        if len(found) < n and not (stop is not None and stop()):
            more = self.model.draft(n - len(found), stop)
            self._note(MODEL, start + len(found), more.tokens)
            block = block.then(more)
        return block

    def draft_branch(self, back: int, first: int, n: int, stop: Callable[[], bool] | None = None) -> DraftBlock:
        return self.model.draft_branch(back, first, n, stop)

    def commit(self, tokens: Sequence[int]) -> None:
        tokens = [int(t) for t in tokens]
        speculated = self.model.sequence[self._committed :]
        diverged = self._committed + common_prefix_length(speculated, tokens)  # the first position drafted wrong
        end = self._committed + len(tokens)
        live = []
        for chain in self._chains:
            if diverged < end and chain.start > diverged:  # drafted on a prefix the verifier did not commit
                continue
            while chain.next < min(end, chain.start + len(chain.tokens)):
                hit = chain.tokens[chain.next - chain.start] == tokens[chain.next - self._committed]
                self.acceptance[chain.source].proposed += 1
                self.acceptance[chain.source].accepted += int(hit)
                chain.next += 1
                if not hit:  # as a block is verified: nothing past its first miss counts
                    chain.next = chain.start + len(chain.tokens)
            if chain.next < chain.start + len(chain.tokens):
                live.append(chain)
        self._chains = live
        self._committed = end
        self.model.commit(tokens)

    def rewind(self) -> None:
        self._chains.clear()
        self.model.rewind()

    def close(self) -> None:
        self.model.close()

    # -- internals ---------------------------------------------------------
    def _note(self, source: str, start: int, tokens: Sequence[int]) -> None:
        if tokens:
            self._chains.append(_Chain(source, start, [int(t) for t in tokens], start))
