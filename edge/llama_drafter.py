"""A drafter for any GGUF model, run by llama.cpp through llama-cpp-python.

Per-step logits come from ``llama_get_logits_ith(ctx, -1)`` (no
``logits_all``, which would allocate n_ctx x V floats); rollback is setting
``n_tokens`` back, after which llama.cpp drops the stale KV entries on the
next eval. The context holds two KV sequences over one unified cache: the
speculation's (0) and a branch's (1, ``draft_branch``), which shares the
speculation's cells up to where it departs (``llama_memory_seq_cp``), so a
branch costs its own drafts only, and the speculation is not read again after
it. The drafter owns no sampling RNG: every proposal is a pure function of its
logits and the session's counters (``edge.drafter.propose``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from edge.drafter import DraftBlock, DrafterStats, OwnsSpeculation, Speculation, common_prefix_length, propose
from edge.gguf_vocab import GgufVocab, load_llama
from shared.params import SamplingParams

__all__ = ["LlamaDrafter", "BRANCH_SEQUENCE"]

BRANCH_SEQUENCE = 1  # the KV sequence a branch is drafted on (the speculation's is 0)

log = logging.getLogger(__name__)


def _default_threads() -> int:
    return max(1, min(4, (os.cpu_count() or 2) // 2))


class LlamaDrafter(OwnsSpeculation):
    """``Drafter`` backed by a llama.cpp context. Not thread-safe."""

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        f32_kv_cache: bool = False,
    ) -> None:
        import llama_cpp

        path = Path(model_path)
        self._llama_cpp = llama_cpp
        started = time.perf_counter()
        kv_type = {"type_k": 0, "type_v": 0} if f32_kv_cache else {}
        # The prompt is read with as many threads as drafting uses (llama-cpp-python's default is every
        # core: on a device whose app is held to fewer cores, or shares them, its threads then spin
        # against the thread that reads the cloud's answers; measured with one core and two threads,
        # the split's first token came 20 to 70 ms later).
        threads = n_threads or _default_threads()
        # (A context of one position takes one sequence: llama.cpp aborts on two.)
        sequences = 2 if n_ctx > 1 else 1
        self.llm = load_llama(path, sequences=sequences, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                              logits_all=False, **kv_type)
        # One token at a time, on ``BRANCH_SEQUENCE`` (None: one sequence, branches draft on the speculation's).
        self._branch_batch = llama_cpp.llama_batch_init(1, 0, 1) if sequences > 1 else None
        self._branch_held: list[int] = []  # the tokens ``BRANCH_SEQUENCE`` holds evaluated
        self.vocab = GgufVocab(self.llm)
        self.vocab_size = self.vocab.size
        self.context_size = n_ctx
        self.model_name = path.name
        self._spec = Speculation.start([])  # committed tokens, then the current speculation
        self._params = SamplingParams()
        self._prompt_pending = False
        self.stats = DrafterStats()
        self._warm_up()
        log.info("drafter %s loaded in %.2fs (vocab %d)", path.name, time.perf_counter() - started, self.vocab_size)

    def _warm_up(self) -> None:
        """One eval at load, as llama.cpp's own tools do: it faults the weights in and sets up the
        compute buffers, so the first prompt of a generation runs at speed."""
        bos = self.llm.token_bos()
        self.llm.eval([bos if 0 <= bos < self.vocab_size else 0])
        self.llm.n_tokens = 0

    # -- lifecycle ---------------------------------------------------------
    def begin(self, prompt: Sequence[int], params: SamplingParams) -> None:
        if not prompt:
            raise ValueError("prompt must hold at least one token")
        if len(prompt) >= self.context_size:
            raise ValueError(f"prompt of {len(prompt)} tokens does not fit the drafter context of {self.context_size}")
        self._params = params
        # llama.cpp's cache still holds the evaluated prefix of the last sequence: keep what the new
        # prompt shares with it (a conversation's next turn re-reads only what changed).
        shared = common_prefix_length(self._spec.tokens[: self.llm.n_tokens], prompt)
        self._spec = Speculation.start(prompt)
        self.llm.n_tokens = shared
        self._prompt_pending = True

    def draft(self, n: int, stop: Callable[[], bool] | None = None) -> DraftBlock:
        return self._draft(n, stop, self.next_logits)

    def _draft(self, n: int, stop: Callable[[], bool] | None, next_logits: Callable[[], np.ndarray]) -> DraftBlock:
        """Up to ``n`` proposals continuing ``self._spec.tokens``, each from ``next_logits()`` after the last."""
        started = time.perf_counter()
        seq = self._spec.tokens
        n = min(n, self.context_size - len(seq) - 1)  # near a full context: fewer drafts, then none
        tokens, q, runner_up, margins = [], [], [], []
        for _ in range(max(n, 0)):
            if stop is not None and stop():
                break
            logits = next_logits()
            proposal = propose(logits, self._params, position=len(seq))
            seq.append(proposal.token)
            tokens.append(proposal.token)
            q.append(proposal.q)
            runner_up.append(proposal.runner_up)
            margins.append(proposal.margin)
        self.stats.record_draft(len(tokens), time.perf_counter() - started)
        return DraftBlock(tokens, q if q and q[0] is not None else None, runner_up or None, margins or None)

    def draft_branch(self, back: int, first: int, n: int, stop: Callable[[], bool] | None = None) -> DraftBlock:
        room = self.context_size - len(self._spec.tokens) - 1  # (the branch's cells and the speculation's share one cache)
        with self._spec.branched(back, first) as keep:
            if self._branch_batch is not None:
                return self._draft(min(n, room), stop, self._branch_logits(keep))
            try:
                return self._draft(min(n, room), stop, self.next_logits)
            finally:  # llama.cpp re-reads the speculation's tail, in one batch, on the next draft
                self.llm.n_tokens = min(self.llm.n_tokens, keep)

    def speculate(self, tokens: Sequence[int]) -> None:
        """``OwnsSpeculation.speculate``; where the last branch holds them evaluated (a speculation cache's
        branch taken), its KV cells become the speculation's instead of being read again."""
        super().speculate(tokens)
        start = self.llm.n_tokens
        if len(self._branch_held) <= start:  # (nothing of the branch's past what the speculation holds evaluated)
            return
        end = common_prefix_length(self._branch_held, self._spec.tokens)
        if end > start:
            memory = self._llama_cpp.llama_get_memory(self.llm.ctx)
            self._llama_cpp.llama_memory_seq_rm(memory, 0, start, -1)
            self._llama_cpp.llama_memory_seq_cp(memory, BRANCH_SEQUENCE, 0, start, end)
            self.llm.n_tokens = end

    def commit(self, tokens: Sequence[int]) -> None:
        valid = self._spec.commit(tokens)
        self.llm.n_tokens = min(self.llm.n_tokens, valid)  # llama.cpp drops stale KV entries on the next eval

    def rewind(self) -> None:
        self.llm.n_tokens = min(self.llm.n_tokens, self._spec.rewind())

    def close(self) -> None:
        if self._branch_batch is not None:
            self._llama_cpp.llama_batch_free(self._branch_batch)
            self._branch_batch = None
        self.llm.close()

    # -- logits ------------------------------------------------------------
    def _branch_logits(self, keep: int) -> Callable[[], np.ndarray]:
        """``next_logits`` for a branch that departs from the speculation at position ``keep``: the branch's
        sequence shares the speculation's KV cells before it (evaluated first where they are not yet) and
        evaluates its own tokens on ``BRANCH_SEQUENCE``, one at a time."""
        lib, ctx, seq = self._llama_cpp, self.llm.ctx, self._spec.tokens
        if self.llm.n_tokens < keep:
            self._eval(seq[self.llm.n_tokens:keep])
        memory = lib.llama_get_memory(ctx)
        lib.llama_memory_seq_rm(memory, 0, self.llm.n_tokens, -1)  # (stale cells: its next eval drops them anyway)
        lib.llama_memory_seq_rm(memory, BRANCH_SEQUENCE, -1, -1)
        lib.llama_memory_seq_cp(memory, 0, BRANCH_SEQUENCE, 0, keep)
        held = self._branch_held = seq[:keep]
        batch = self._branch_batch

        def next_logits() -> np.ndarray:
            started = time.perf_counter()
            for position in range(len(held), len(seq)):
                batch.n_tokens = 1
                batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.logits[0] = seq[position], position, 1, True
                batch.seq_id[0][0] = BRANCH_SEQUENCE
                if lib.llama_decode(ctx, batch) != 0:
                    raise RuntimeError(f"llama_decode failed on a branch at position {position}")
                held.append(seq[position])
            self.stats.record_eval(time.perf_counter() - started, prompt=False)
            return np.ctypeslib.as_array(lib.llama_get_logits_ith(ctx, -1), shape=(self.vocab_size,))

        return next_logits

    def next_logits(self) -> np.ndarray:
        """Logits [V] for the position after the current sequence (evaluates what is pending).

        The array is llama.cpp's buffer: valid until the next eval; copy to keep it.
        """
        seq = self._spec.tokens
        if self.llm.n_tokens >= len(seq):
            self.llm.n_tokens = len(seq) - 1  # re-evaluate the last token to get its logits
        self._eval(seq[self.llm.n_tokens :])
        ptr = self._llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.vocab_size,))

    def _eval(self, tokens: Sequence[int]) -> None:
        """Evaluate ``tokens`` on the speculation's sequence, after what it holds (``llm.n_tokens``)."""
        started = time.perf_counter()
        self.llm.eval(tokens)
        self.stats.record_eval(time.perf_counter() - started, prompt=self._prompt_pending)
        self._prompt_pending = False
