"""One generation's verifier state: committed tokens, KV cache, epoch, counters.

Transport-agnostic: the gRPC servicer and the in-process decoder both drive a
``VerifierSession``. It refuses blocks that do not continue its committed
state (wrong epoch or start position, too long, after the end) with
``BlockRejected``; it never trusts the caller.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from cloud.engine import TargetEngine
from cloud.verify_torch import verify_block
from shared.params import SamplingParams
from shared.sparse import SparseDist
from shared.stats import DecodeStats
from shared.verdict import StopReason, Verdict
from shared.wire import next_epoch

__all__ = ["VerifierSession", "BlockRejected"]


class BlockRejected(ValueError):
    """A block that cannot be verified against this session's state."""


class VerifierSession:
    """Verifies blocks for one sequence. Not thread-safe: one caller at a time."""

    def __init__(
        self,
        engine: TargetEngine,
        prompt: Sequence[int],
        params: SamplingParams,
        *,
        max_new_tokens: int,
        max_draft_len: int,
    ) -> None:
        if not prompt:
            raise ValueError("prompt must hold at least one token")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        bad = [t for t in prompt if not 0 <= t < engine.vocab_size]
        if bad:
            raise ValueError(f"prompt token {bad[0]} is outside the vocabulary of {engine.vocab_size}")
        self.engine = engine
        self.params = params
        self.max_new_tokens = max_new_tokens
        self.max_draft_len = max_draft_len
        self.tokens = [int(t) for t in prompt]
        self.prompt_len = len(self.tokens)
        self.epoch = 0
        self.done = False
        self.stop_reason = StopReason.NONE
        self.stats = DecodeStats()
        self.seq = engine.new_sequence()
        self.verify_s = 0.0  # wall time inside verify(), forward included
        if len(self.tokens) > 1:  # the last prompt token stays pending, fed with the first block
            engine.forward(self.seq, self.tokens[:-1])
        self.stats.target_forwards = self.forwards

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def forwards(self) -> int:
        """Target forwards run for this session, prefill included (the engine counts them)."""
        return self.seq.forwards

    def verify(
        self, epoch: int, start_position: int, drafts: Sequence[int], q: Sequence[SparseDist] | None = None
    ) -> Verdict:
        """Verify one block in one target forward and commit its outcome."""
        if self.done:
            raise BlockRejected("session already finished")
        if epoch != self.epoch:
            raise BlockRejected(f"stale block: epoch {epoch}, session is at epoch {self.epoch}")
        if start_position != len(self.tokens):
            raise BlockRejected(f"block starts at position {start_position}, committed length is {len(self.tokens)}")
        if len(drafts) > self.max_draft_len:
            raise BlockRejected(f"block of {len(drafts)} drafts exceeds the limit of {self.max_draft_len}")
        started = time.perf_counter()
        drafts = [int(t) for t in drafts]
        logits = self.engine.forward(self.seq, [self.tokens[-1], *drafts])  # [D+1, V]
        result = verify_block(self.params, drafts, logits, start_position, q)
        committed = [*drafts[: result.accepted], result.token]
        # An EOS or the token limit may end the generation inside the block.
        end = len(committed)
        for i, token in enumerate(committed):
            if token in self.engine.eos_token_ids:
                end, self.stop_reason = i + 1, StopReason.EOS
                break
            if self.generated + i + 1 >= self.max_new_tokens:
                end, self.stop_reason = i + 1, StopReason.LENGTH
                break
        committed = committed[:end]
        accepted = min(result.accepted, end)
        token = committed[-1] if end > accepted else None
        self.tokens.extend(committed)
        self.engine.crop(self.seq, len(self.tokens) - 1)  # everything but the new pending token
        self.done = self.stop_reason is not StopReason.NONE
        verdict = Verdict(
            epoch=epoch,
            start_position=start_position,
            accepted=accepted,
            token=token,
            bonus=result.bonus and token is not None,
            done=self.done,
            stop_reason=self.stop_reason,
        )
        self.epoch = next_epoch(self.epoch, verdict)
        self.stats.record_round(len(drafts), accepted, len(committed))
        self.stats.target_forwards = self.forwards
        elapsed = time.perf_counter() - started
        self.verify_s += elapsed
        self.stats.wall_s += elapsed
        return verdict
