"""Sessions the benches run against a real verifier, and a real drafter's blocks recorded and replayed.

A bench that measures the verifier must not be bound by its edges: each
session is decoded once alone with the real llama.cpp drafter, which records
what it proposed after each prefix (``RecordingDrafter``, ``record_drafts``);
in the timed runs a ``ReplayDrafter`` proposes the same blocks for the same
prefixes (verification is exact, so the prefixes recur), costing microseconds.
Also: the models a bench loads, the cores the edges keep off, and one session
decoded split or cloud-only. Used by the capacity, soak and fairness benches.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from edge.drafter import DraftBlock, ModelFreeDrafter, Speculation, one_hot_block
from edge.schedule import SpecConfig
from sim.experiment.runner import DEFAULT_PROMPTS

__all__ = ["PROMPTS", "RecordingDrafter", "ReplayDrafter", "BenchSession", "bench_models", "first_core", "edges_off",
           "session_params", "cloud_only_session", "split_session", "record_drafts"]


PROMPTS = [
    *DEFAULT_PROMPTS,
    "What is the difference between a virus and a bacterium?",
    "Describe how a bicycle works to a child.",
    "Give three reasons to learn a second language.",
    "Summarize the plot of a detective novel in one paragraph.",
    "How do plants turn sunlight into food?",
]


class RecordingDrafter:
    """Wraps a real drafter and records, per (seed, sequence drafted from), the block it proposed."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.vocab_size = inner.vocab_size
        self.stats = inner.stats
        self.blocks: dict[tuple, DraftBlock] = {}
        self._spec = Speculation.start([])
        self._seed = 0

    def begin(self, prompt: Sequence[int], params) -> None:
        self._spec = Speculation.start(prompt)
        self._seed = params.seed
        self.inner.begin(prompt, params)

    def draft(self, n: int, stop: Callable[[], bool] | None = None) -> DraftBlock:
        key = (self._seed, *self._spec.tokens)
        block = self.inner.draft(n, stop)
        self.blocks[key] = block
        self._spec.tokens.extend(block.tokens)
        return block

    def commit(self, tokens: Sequence[int]) -> None:
        self._spec.commit(tokens)
        self.inner.commit(tokens)

    def rewind(self) -> None:
        self._spec.rewind()
        self.inner.rewind()

    def close(self) -> None:
        self.inner.close()


class ReplayDrafter(ModelFreeDrafter):
    """Proposes the blocks a ``RecordingDrafter`` recorded, keyed by (seed, sequence drafted from);
    an unrecorded sequence gets an empty block (the cloud then decodes that position alone)."""

    def __init__(self, blocks: dict[tuple, DraftBlock], vocab_size: int) -> None:
        super().__init__(vocab_size)
        self.blocks = blocks
        self.misses = 0

    def propose_block(self, n: int) -> DraftBlock:
        block = self.blocks.get((self._params.seed, *self._spec.tokens))
        if block is None:
            self.misses += 1
            return one_hot_block([], self._params)
        return DraftBlock(block.tokens[:n], block.q[:n] if block.q else block.q)


@dataclass(frozen=True)
class BenchSession:
    prompt: list[int]
    seed: int


def bench_models(target: str | None, drafter: str | None, tiny: bool, tmp: str) -> tuple[str, str | None]:
    if tiny:
        from sim.fixtures.tiny_models import write_tiny_models

        paths = write_tiny_models(tmp, seed=0)
        return paths["target"], paths["drafter_noisy"]
    from cloud.models import resolve_target

    if target is not None and drafter is None:
        raise ValueError("a target needs a matching drafter GGUF (--drafter)")
    return str(resolve_target(target)), drafter


def first_core() -> set[int] | None:

    try:
        return {sorted(os.sched_getaffinity(0))[0]}
    except AttributeError:  # pragma: no cover - not Linux
        return None


@contextmanager
def edges_off(cores: set[int] | None):
    """Keep this process (the edges) off the verifier's ``cores`` while the context lasts."""

    try:
        mine = os.sched_getaffinity(0)
    except AttributeError:  # pragma: no cover - not Linux
        yield
        return
    others = mine - (cores or set())
    if cores and others:
        os.sched_setaffinity(0, others)
    try:
        yield
    finally:
        os.sched_setaffinity(0, mine)


def session_params(seed: int, temperature: float):
    """A session's sampling: greedy at temperature 0, else coupled with its own seed (split and
    cloud-only alike, so both must produce target-only's tokens)."""
    from shared.params import Mode, SamplingParams

    if temperature == 0:
        return SamplingParams(mode=Mode.GREEDY)
    return SamplingParams(mode=Mode.COUPLED, temperature=temperature, seed=seed)


def cloud_only_session(address: str, session: BenchSession, vocab, max_new_tokens: int, temperature: float):
    from edge.cloud_only import cloud_only_generate
    from edge.endpoint import VerifierEndpoint

    started = time.perf_counter()
    result = cloud_only_generate(VerifierEndpoint(address, *vocab), session.prompt,
                                 session_params(session.seed, temperature), max_new_tokens=max_new_tokens)
    return result.tokens, started, time.perf_counter()


def split_session(address: str, session: BenchSession, vocab, drafter, max_new_tokens: int, draft_len: int,
           temperature: float):
    from edge.decode_loop import run_decode
    from edge.endpoint import VerifierEndpoint
    from edge.grpc_verifier import GrpcVerifier

    link = GrpcVerifier(VerifierEndpoint(address, *vocab))
    started = time.perf_counter()
    result = run_decode(drafter, link, session.prompt, session_params(session.seed, temperature),
                        max_new_tokens=max_new_tokens, spec=SpecConfig(draft_len))
    return result.tokens, started, time.perf_counter(), result.stats


def record_drafts(real, address, work, vocab, max_new_tokens, draft_len, temperature):
    """Each session decoded alone with the real drafter: the blocks it proposed, and its acceptance."""
    blocks: dict = {}
    drafted = accepted = 0
    for session in work:
        recorder = RecordingDrafter(real)
        _, _, _, stats = split_session(address, session, vocab, recorder, max_new_tokens, draft_len, temperature)
        blocks.update(recorder.blocks)
        drafted += stats.drafted
        accepted += stats.accepted
    return blocks, accepted / drafted if drafted else 0.0
