"""The edge's lossless loop: draft blocks, have them verified, commit, repeat.

Up to ``window`` blocks are in flight: while one is verified, the next is
drafted from the drafter's own unverified tokens and sent with
``more_follows`` on the one before it (``window`` 1 is lock-step). A
correction voids every later block; they were drafted at the old epoch, so
the verifier drops them, and the loop drafts again from the committed prefix
plus the correction. Randomness is keyed by absolute position, so where
drafting pauses or restarts never changes the output.

Transport-agnostic: a ``VerifierConnection`` is answered in-process
(``sim.inprocess``) or over gRPC (``edge.client``). The loop trusts only
verdicts that answer the oldest block in flight, and stops at ``done``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from edge.drafter import DraftBlock, Drafter
from shared.params import SamplingParams
from shared.stats import DecodeStats
from shared.verdict import StopReason, Verdict
from shared.wire import next_epoch

__all__ = ["VerifierConnection", "SessionTerms", "GenerationResult", "run_decode", "ProtocolError"]


class ProtocolError(RuntimeError):
    """The verifier answered something that does not fit the blocks we sent."""


@dataclass(frozen=True)
class SessionTerms:
    """What the verifier allows a session (its ``Opened``)."""

    max_draft_len: int  # drafts per block
    max_blocks_in_flight: int  # blocks sent and not yet answered
    answers_first_position: bool = False  # a verdict for the first position comes unasked (an empty block)


class VerifierConnection(Protocol):
    """One generation session with a verifier, wherever it runs.

    Verdicts come back in the order the blocks were sent; a block drafted at
    an epoch older than the session's gets none.
    """

    forwards: int  # target forwards the verifier reports for this session, prefill included

    def open(self, prompt: Sequence[int], params: SamplingParams, max_new_tokens: int, max_draft_len: int) -> SessionTerms:
        """Start a session for ``prompt``; returns what the verifier allows."""

    def send(self, epoch: int, start_position: int, block: DraftBlock, more_follows: bool) -> None:
        """Queue one block for verification (returns at once)."""

    def receive(self) -> Verdict:
        """The next verdict (blocks until it arrives)."""

    def close(self) -> None:
        """End the session."""


@dataclass
class GenerationResult:
    tokens: list[int]  # generated ids, prompt excluded
    stop_reason: StopReason
    stats: DecodeStats = field(default_factory=DecodeStats)
    ttft_s: float = 0.0  # time from start to the first committed token


@dataclass(frozen=True)
class _InFlight:
    epoch: int
    start_position: int
    block: DraftBlock
    more_follows: bool


def run_decode(
    drafter: Drafter,
    verifier: VerifierConnection,
    prompt: Sequence[int],
    params: SamplingParams,
    *,
    max_new_tokens: int,
    draft_len: int,
    window: int = 1,
    on_tokens: Callable[[list[int]], None] | None = None,
) -> GenerationResult:
    """Generate up to ``max_new_tokens`` tokens; ``draft_len`` 0 is target-only decoding.

    ``window``: blocks in flight at most (1 = lock-step; the verifier may
    allow fewer). ``on_tokens`` sees each verdict's committed tokens as soon
    as they are final.
    """
    if draft_len < 0:
        raise ValueError(f"draft length must be >= 0, got {draft_len}")
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    started = time.perf_counter()
    stats = DecodeStats()
    prompt = [int(t) for t in prompt]
    generated: list[int] = []
    in_flight: deque[_InFlight] = deque()
    epoch = 0
    ttft = 0.0
    try:
        terms = verifier.open(prompt, params, max_new_tokens, draft_len)
        draft_len = min(draft_len, terms.max_draft_len)
        window = min(window, terms.max_blocks_in_flight) if draft_len else 1
        drafter.begin(prompt, params)
        end = len(prompt)  # the position after the last token committed or in flight
        if terms.answers_first_position:  # the first token comes right after the prefill
            in_flight.append(_InFlight(epoch, end, DraftBlock([]), False))
        while True:
            while len(in_flight) < window and not (in_flight and not in_flight[-1].more_follows):
                # Leave room for the correction/bonus token inside the limit.
                room = max_new_tokens - (end - len(prompt)) - 1
                n = min(draft_len, room)
                if n <= 0 and in_flight:
                    break  # the limit is reached by what is in flight; wait for it
                block = drafter.draft(n) if n > 0 else DraftBlock([])
                more = window > 1 and 0 < len(block.tokens) < room
                verifier.send(epoch, end, block, more)
                in_flight.append(_InFlight(epoch, end, block, more))
                end += len(block.tokens)
            verdict = verifier.receive()
            sent = in_flight.popleft()
            if (
                verdict.epoch != sent.epoch
                or verdict.start_position != sent.start_position
                or verdict.accepted > len(sent.block.tokens)
                or (verdict.is_deferred and not sent.more_follows)
            ):
                raise ProtocolError(
                    f"verdict for epoch {verdict.epoch} position {verdict.start_position} ({verdict.accepted} accepted) "
                    f"does not answer the block sent at epoch {sent.epoch} position {sent.start_position}"
                )
            committed = verdict.committed(sent.block.tokens)
            drafter.commit(committed)
            generated.extend(committed)
            stats.record_round(len(sent.block.tokens), verdict.accepted, len(committed))
            if committed and not ttft:
                ttft = time.perf_counter() - started
            if on_tokens and committed:
                on_tokens(committed)
            if verdict.done:
                break
            epoch = next_epoch(epoch, verdict)
            if not verdict.is_deferred:  # a correction voids what is in flight; after a bonus nothing is
                in_flight.clear()
                end = len(prompt) + len(generated)
            if len(generated) >= max_new_tokens:
                raise ProtocolError(f"verifier did not stop at the token limit of {max_new_tokens}")
        stats.wall_s = time.perf_counter() - started  # tearing the session down is not generation time
    finally:
        verifier.close()
    stats.target_forwards = verifier.forwards
    return GenerationResult(generated, verdict.stop_reason, stats, ttft)
