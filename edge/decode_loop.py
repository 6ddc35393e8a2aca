"""The edge's lossless loop: draft a block, have it verified, commit, repeat.

Transport-agnostic: a ``VerifierConnection`` is answered in-process
(``sim.inprocess``) or over gRPC (``edge.client``). The loop trusts only verdicts that answer
the block it sent, and stops at the verifier's ``done``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from edge.drafter import DraftBlock, Drafter
from shared.params import SamplingParams
from shared.stats import DecodeStats
from shared.verdict import StopReason, Verdict
from shared.wire import next_epoch

__all__ = ["VerifierConnection", "GenerationResult", "run_decode", "ProtocolError"]


class ProtocolError(RuntimeError):
    """The verifier answered something that does not fit the block we sent."""


class VerifierConnection(Protocol):
    """One generation session with a verifier, wherever it runs."""

    forwards: int  # target forwards the verifier reports for this session so far, prefill included

    def open(self, prompt: Sequence[int], params: SamplingParams, max_new_tokens: int, max_draft_len: int) -> int:
        """Start a session for ``prompt``; returns the block length the verifier allows (<= max_draft_len)."""

    def verify(self, epoch: int, start_position: int, block: DraftBlock) -> Verdict:
        """Verify one block; returns the verdict for it."""

    def close(self) -> None:
        """End the session."""


@dataclass
class GenerationResult:
    tokens: list[int]  # generated ids, prompt excluded
    stop_reason: StopReason
    stats: DecodeStats = field(default_factory=DecodeStats)
    ttft_s: float = 0.0  # time from start to the first committed token


def run_decode(
    drafter: Drafter,
    link: VerifierConnection,
    prompt: Sequence[int],
    params: SamplingParams,
    *,
    max_new_tokens: int,
    draft_len: int,
    on_tokens: Callable[[list[int]], None] | None = None,
) -> GenerationResult:
    """Generate up to ``max_new_tokens`` tokens; ``draft_len`` 0 is target-only decoding.

    ``on_tokens`` sees each round's committed tokens as soon as they are final.
    """
    if draft_len < 0:
        raise ValueError(f"draft length must be >= 0, got {draft_len}")
    started = time.perf_counter()
    stats = DecodeStats()
    prompt = [int(t) for t in prompt]
    generated: list[int] = []
    epoch = 0
    ttft = 0.0
    try:
        draft_len = link.open(prompt, params, max_new_tokens, draft_len)
        drafter.begin(prompt, params)
        while True:
            position = len(prompt) + len(generated)
            # Leave room for the correction/bonus token inside the limit.
            n = min(draft_len, max_new_tokens - len(generated) - 1)
            block = drafter.draft(n) if n > 0 else DraftBlock([])
            verdict = link.verify(epoch, position, block)
            if verdict.epoch != epoch or verdict.start_position != position or verdict.accepted > len(block.tokens):
                raise ProtocolError(
                    f"verdict for epoch {verdict.epoch} position {verdict.start_position} "
                    f"({verdict.accepted} accepted) does not answer the block sent at epoch {epoch} position {position}"
                )
            committed = verdict.committed(block.tokens)
            epoch = next_epoch(epoch, verdict)
            drafter.commit(committed)
            generated.extend(committed)
            stats.record_round(len(block.tokens), verdict.accepted, len(committed))
            if committed and not ttft:
                ttft = time.perf_counter() - started
            if on_tokens and committed:
                on_tokens(committed)
            if verdict.done:
                break
            if len(generated) >= max_new_tokens:
                raise ProtocolError(f"verifier did not stop at the token limit of {max_new_tokens}")
        stats.wall_s = time.perf_counter() - started  # tearing the link down is not generation time
    finally:
        link.close()
    stats.target_forwards = link.forwards
    return GenerationResult(generated, verdict.stop_reason, stats, ttft)
