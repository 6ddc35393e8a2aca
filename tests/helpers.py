"""Test helpers shared by several test files: exact distributions and distances, the tiny drafters,
scripted drafters and the pipelining tests' prompts, sessions and counting controller."""

from __future__ import annotations

from collections import Counter

import numpy as np

from edge.controller import Controller
from shared.logits import process_logits
from shared.params import Mode, SamplingParams

GREEDY = SamplingParams(mode=Mode.GREEDY)
TEXTS = ["The cat sat on the mat.", "We have 3 dogs and 12 cats!"]


def exact_distribution(engine, prompt, params, length=3) -> dict[tuple[int, ...], float]:
    """P(first ``length`` generated tokens) by enumerating the target's top-k tree."""
    out: dict[tuple[int, ...], float] = {}

    def walk(prefix, prob):
        if len(prefix) == length:
            out[tuple(prefix)] = prob
            return
        seq = engine.new_sequence()
        logits = engine.forward(seq, list(prompt) + prefix)[-1:]
        p = process_logits(logits.numpy(), params)[0]
        for token in np.flatnonzero(p > 0):
            walk(prefix + [int(token)], prob * p[token])

    walk([], 1.0)
    return out


def total_variation(counts: Counter, n: int, dist: dict) -> float:
    keys = set(counts) | set(dist)
    return 0.5 * sum(abs(counts.get(k, 0) / n - dist.get(k, 0.0)) for k in keys)


def tiny_prompt(engine, text: str) -> list[int]:
    """BOS + the tiny tokenizer's ids (the tiny GGUF does not add BOS itself)."""
    return [1, *engine.tokenizer(text, add_special_tokens=False).input_ids]


def greedy_continuation(engine, prompt: list[int], n: int = 40) -> list[int]:
    """The target's own greedy continuation of ``prompt`` (``n`` tokens), decoded one token a forward."""
    from cloud.session import VerifierSession

    session = VerifierSession(engine, prompt, GREEDY, max_new_tokens=n + 24, max_draft_len=16)
    tokens = []
    while len(tokens) < n:
        tokens.append(session.verify(session.epoch, len(prompt) + len(tokens), []).token)
    return tokens


def tiny_drafter(tiny_models, name: str = "drafter_noisy", n_ctx: int = 512):
    """The ``tiny_models`` drafter ``name`` as the tests open one: a context of ``n_ctx`` positions, one
    thread, an F32 KV cache. The caller closes it."""
    from edge.llama_drafter import LlamaDrafter

    return LlamaDrafter(tiny_models[name], n_ctx=n_ctx, n_threads=1, f32_kv_cache=True)


def new_session(engine, prompt, max_new_tokens=64, params=GREEDY, **kwargs):
    """A verifier session on ``engine`` (greedy by default) that takes blocks of up to 16 drafts."""
    from cloud.session import VerifierSession

    return VerifierSession(engine, prompt, params, max_new_tokens=max_new_tokens, max_draft_len=16, **kwargs)


class CountingController(Controller):
    """Counts what the loop reports: acceptance (every drafted block's, and the early block's) and blocks."""

    acceptances = blocks = 0

    def observe_acceptance(self, drafted, accepted, first=0):
        self.acceptances += 1
        super().observe_acceptance(drafted, accepted, first)

    def observe_block(self, *args, **kwargs):
        self.blocks += 1
        super().observe_block(*args, **kwargs)


class ScriptedDrafter:
    """Drafts a wrong token at every position (every ``wrong_every``-th from ``offset``; the target's own
    token elsewhere, whatever came before), with a second choice that is the target's own token
    (``right``) or another wrong one: every correction is then a hit, or a miss. Its hedge branches
    continue with the target's own tokens. ``target``: the target's tokens from position ``offset``."""

    def __init__(self, vocab_size: int, target: list[int], offset: int, right: bool, wrong_every: int = 1) -> None:
        from edge.drafter import DrafterStats, Speculation

        self.vocab_size, self.target, self.offset, self.right = vocab_size, target, offset, right
        self.wrong_every = wrong_every
        self.stats = DrafterStats()
        self._spec = Speculation.start([])

    def begin(self, prompt, params) -> None:
        from edge.drafter import Speculation

        self._spec = Speculation.start(prompt)

    def _want(self) -> int:
        return self.target[len(self._spec.tokens) - self.offset]

    def draft(self, n: int, stop=None):
        from edge.drafter import DraftBlock

        tokens, runner_up = [], []
        for _ in range(n):
            if stop is not None and stop():
                break
            want = self._want()
            wrong = (len(self._spec.tokens) - self.offset) % self.wrong_every == 0
            tokens.append((want + 1) % self.vocab_size if wrong else want)
            runner_up.append(want if self.right else (want + 2) % self.vocab_size)
            self._spec.tokens.append(tokens[-1])
        self.stats.record_draft(len(tokens), 0.0)
        return DraftBlock(tokens, None, runner_up)

    def draft_branch(self, back: int, first: int, n: int) -> list[int]:
        out = []
        with self._spec.branched(back, first):
            for _ in range(n):
                out.append(self._want())
                self._spec.tokens.append(out[-1])
        return out

    def commit(self, tokens) -> None:
        self._spec.commit(tokens)

    def rewind(self) -> None:
        self._spec.rewind()

    def close(self) -> None:
        pass
