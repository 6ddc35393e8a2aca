"""Offline fallback: the drafter alone decodes when the cloud cannot be reached.

Not the target's output: each token is the drafter's own proposal (its
argmax when greedy, a sample from its own distribution otherwise), so the
caller must say it answered without the cloud.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence

from edge.decode_loop import GenerationResult
from edge.drafter import Drafter
from shared.params import SamplingParams
from shared.stats import DecodeStats
from shared.verdict import StopReason

__all__ = ["drafter_only_decode"]


def drafter_only_decode(
    drafter: Drafter,
    prompt: Sequence[int],
    params: SamplingParams,
    *,
    max_new_tokens: int,
    eos_ids: Collection[int],
    on_tokens: Callable[[list[int]], bool | None] | None = None,
) -> GenerationResult:
    """Up to ``max_new_tokens`` tokens from the drafter alone; ``on_tokens`` as in ``run_decode``."""
    started = time.perf_counter()
    stats, generated, ttft, stop = DecodeStats(), [], 0.0, StopReason.LENGTH
    drafter.begin(list(prompt), params)
    while len(generated) < max_new_tokens:
        block = drafter.draft(1).tokens
        if not block:  # the drafter's context is full
            break
        drafter.commit(block)
        generated.extend(block)
        stats.record_round(0, 0, 1)
        ttft = ttft or time.perf_counter() - started
        halt = on_tokens is not None and on_tokens(block) is True
        if block[0] in eos_ids or halt:
            stop = StopReason.EOS if block[0] in eos_ids else StopReason.STOP
            break
    stats.wall_s = time.perf_counter() - started
    return GenerationResult(generated, stop, stats, ttft)
