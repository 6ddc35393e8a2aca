"""The drafter lifecycle shared by every proposer, and the per-mode proposal rule.

A drafter is driven as ``begin(prompt, params)``, then ``draft(n)`` and
``commit(tokens)`` calls, then ``close()`` (llama.cpp's ``begin / draft /
accept`` shape). ``draft`` continues from the drafter's own speculation, so
several blocks can be drafted before any is verified (blocks in flight).
``commit`` receives the tokens the verifier committed: speculation they
confirm is kept, the rest is rolled back (``Speculation``).
Each drafter keeps its own ``DrafterStats`` (llama.cpp's per-proposer
``n_drafted`` / ``t_draft_us``), which every sink reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, NamedTuple, Protocol

import numpy as np

from shared.logits import top_candidates
from shared.noise import Purpose, exponential
from shared.params import SamplingParams
from shared.sparse import SparseDist, quantize, sample_sparse

__all__ = [
    "DraftBlock",
    "Drafter",
    "DrafterStats",
    "ModelFreeDrafter",
    "OwnsSpeculation",
    "Speculation",
    "Proposal",
    "propose",
    "one_hot_block",
    "common_prefix_length",
]

# How many of the drafter's highest logits a proposal looks at. The choice
# never affects losslessness, only acceptance; q̃ keeps at most draft_top_k.
CANDIDATES = 64


@dataclass(frozen=True)
class DraftBlock:
    tokens: list[int]  # [n] proposed ids, positions start_position .. start_position + n - 1
    q: list[SparseDist] | None = None  # [n] q̃ per token, rejection mode only
    runner_up: list[int | None] | None = None  # [n] the drafter's second choice per position, when it has one
    margins: list[float | None] | None = None  # [n] how far ahead the choice was of the runner-up (small: a likely flip)
    branches: tuple[tuple[int, list[int]], ...] = ()  # hedges: (index of the draft, its guessed correction and more)

    def first(self, n: int) -> DraftBlock:
        """The block's first ``n`` drafts (no branches)."""
        def cut(values: list | None) -> list | None:
            return None if values is None else values[:n]

        return DraftBlock(self.tokens[:n], cut(self.q), cut(self.runner_up), cut(self.margins))

    def then(self, more: DraftBlock) -> DraftBlock:
        """This block followed by ``more``, drafted right after it by the same drafter (no branches)."""
        if not self.tokens or not more.tokens:
            return more if not self.tokens else self

        def joined(a: list | None, b: list | None) -> list | None:
            return None if a is None or b is None else a + b

        return DraftBlock(self.tokens + more.tokens, joined(self.q, more.q), joined(self.runner_up, more.runner_up),
                          joined(self.margins, more.margins))


@dataclass
class DrafterStats:
    """A drafter's counters, cumulative from construction or the last ``reset()``.

    ``draft_s - eval_s`` is the drafter's own overhead (proposal rule, Python);
    ``eval_s - prompt_eval_s`` is the model's per-token decoding. Model-free
    drafters keep both eval counters at 0. Each counter is written only by
    ``record_draft`` / ``record_eval``.
    """

    drafted: int = 0  # tokens returned by draft()
    draft_s: float = 0.0  # seconds inside draft(), eval included
    eval_s: float = 0.0  # seconds inside the model's eval
    prompt_eval_s: float = 0.0  # the part of eval_s spent reading prompts

    def record_draft(self, tokens: int, seconds: float) -> None:
        """One draft() call that returned ``tokens`` tokens in ``seconds``."""
        self.drafted += tokens
        self.draft_s += seconds

    def record_eval(self, seconds: float, *, prompt: bool) -> None:
        """One model eval; ``prompt`` when it read (the rest of) a prompt."""
        self.eval_s += seconds
        if prompt:
            self.prompt_eval_s += seconds

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, f.default)

    def to_json(self) -> dict[str, int | float]:
        """A JSON object with exactly the field names as keys (stable), values unrounded."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DrafterStats:
        """The inverse of ``to_json``; missing or unknown keys are a ``ValueError``."""
        names = [f.name for f in fields(cls)]
        if set(data) != set(names):
            raise ValueError(f"drafter stats need exactly the keys {names}, got {sorted(data)}")
        return cls(
            drafted=int(data["drafted"]),
            draft_s=float(data["draft_s"]),
            eval_s=float(data["eval_s"]),
            prompt_eval_s=float(data["prompt_eval_s"]),
        )


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class Speculation:
    """A drafter's sequence: the committed prefix, then its own unverified proposals."""

    tokens: list[int]  # [committed + speculated]
    committed: int  # length of the committed prefix

    @classmethod
    def start(cls, prompt: Sequence[int]) -> Speculation:
        tokens = [int(t) for t in prompt]
        return cls(tokens, len(tokens))

    @property
    def speculated(self) -> list[int]:
        return self.tokens[self.committed :]

    def commit(self, tokens: Sequence[int]) -> int:
        """Append the verifier's committed ``tokens``; returns how much of the old sequence stays valid.

        When the speculation begins with ``tokens`` (every committed token was
        proposed), what was drafted past them stays speculated; otherwise the
        speculation is replaced from the first mismatch on.
        """
        tokens = [int(t) for t in tokens]
        matched = common_prefix_length(self.speculated, tokens)
        if matched == len(tokens):
            self.committed += matched
            return len(self.tokens)
        self.tokens = self.tokens[: self.committed] + tokens
        valid = self.committed + matched
        self.committed = len(self.tokens)
        return valid

    def rewind(self) -> int:
        """Drop the unverified proposals; returns the committed length (all that stays valid)."""
        del self.tokens[self.committed :]
        return self.committed

    @contextmanager
    def branched(self, back: int, first: int) -> Iterator[int]:
        """Within the ``with`` body, the speculation's last ``back`` tokens are replaced by ``first``
        (what is appended in the body is the branch's); after it, the speculation is restored.
        Yields how many tokens the branch shares with the speculation."""
        if not 1 <= back <= len(self.speculated):
            raise ValueError(f"a branch replaces 1 to {len(self.speculated)} speculated tokens, not {back}")
        keep = len(self.tokens) - back
        saved = self.tokens[keep:]
        del self.tokens[keep:]
        self.tokens.append(int(first))
        try:
            yield keep
        finally:
            del self.tokens[keep:]
            self.tokens.extend(saved)


class Drafter(Protocol):
    """What the decode loop needs from a proposer."""

    vocab_size: int
    stats: DrafterStats

    def begin(self, prompt: Sequence[int], params: SamplingParams) -> None:
        """Start a sequence; ``prompt`` is the committed prefix."""

    def draft(self, n: int, stop: Callable[[], bool] | None = None) -> DraftBlock:
        """Propose up to ``n`` tokens continuing the current speculation (may return fewer). ``stop``,
        where given, may be asked before each token; once it answers True drafting ends there (a
        drafter for which a token costs next to nothing may not ask)."""

    def draft_branch(self, back: int, first: int, n: int, stop: Callable[[], bool] | None = None) -> DraftBlock:
        """Up to ``n`` drafts continuing the speculation with its last ``back`` tokens replaced by
        ``first`` (a hedge branch, or a speculation cache's: ``edge.speculation_cache``), as ``draft``
        returns them (``stop`` as there); the speculation itself is left as it was."""

    @property
    def sequence(self) -> list[int]:
        """The committed tokens, then the speculation (read-only: ``OwnsSpeculation``)."""

    def speculate(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` proposed elsewhere to the speculation, as if drafted here (``OwnsSpeculation``)."""

    def commit(self, tokens: Sequence[int]) -> None:
        """Append the verifier's committed tokens; keep the speculation they confirm, drop the rest."""

    def rewind(self) -> None:
        """Drop every unverified proposal: the next draft continues the committed tokens."""

    def close(self) -> None:
        """Release native resources."""


class OwnsSpeculation:
    """What a drafter that keeps its sequence in ``self._spec`` (a ``Speculation``) lets others do with it
    (``edge.lookup_drafter`` drafts into it)."""

    _spec: Speculation

    @property
    def sequence(self) -> list[int]:
        """The committed tokens, then the speculation (read-only: ``speculate`` appends to it)."""
        return self._spec.tokens

    def speculate(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` proposed elsewhere to the speculation, as if drafted here."""
        self._spec.tokens.extend(int(t) for t in tokens)


class ModelFreeDrafter(OwnsSpeculation):
    """The ``Drafter`` lifecycle for proposers without a model: the speculation is a
    ``Speculation``, and a subclass says what to propose next (``propose_block``)."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.stats = DrafterStats()  # no model: the eval counters stay 0
        self._spec = Speculation.start([])
        self._params = SamplingParams()

    def propose_block(self, n: int) -> DraftBlock:
        """Up to ``n`` proposals continuing ``self._spec.tokens`` (may be fewer, or none)."""
        raise NotImplementedError

    def begin(self, prompt: Sequence[int], params: SamplingParams) -> None:
        self._spec = Speculation.start(prompt)
        self._params = params

    def draft(self, n: int, stop: Callable[[], bool] | None = None) -> DraftBlock:
        started = time.perf_counter()  # (a proposal costs next to nothing: ``stop`` is not asked)
        block = self.propose_block(n)
        self._spec.tokens.extend(block.tokens)
        self.stats.record_draft(len(block.tokens), time.perf_counter() - started)
        return block

    def draft_branch(self, back: int, first: int, n: int, stop: Callable[[], bool] | None = None) -> DraftBlock:
        with self._spec.branched(back, first):
            return self.draft(n, stop)

    def commit(self, tokens: Sequence[int]) -> None:
        self._spec.commit(tokens)

    def rewind(self) -> None:
        self._spec.rewind()

    def close(self) -> None:
        pass


class Proposal(NamedTuple):
    token: int
    q: SparseDist | None  # q̃, rejection mode only
    runner_up: int | None  # the drafter's second choice: its guess for the target's correction (greedy, coupled)
    margin: float | None = None  # greedy: logit gap to the runner-up; coupled: log of its race-key ratio


def propose(logits: np.ndarray, params: SamplingParams, position: int) -> Proposal:
    """The drafter's token at ``position`` from its logits [V], per mode.

    greedy (temperature 0, any mode): argmax q. coupled: the exponential race on q with the same SAMPLE
    noise the target uses, so the draft equals the target's token whenever q
    and p pick the same winner. rejection: an exact sample from q̃, returned
    with q̃ so the verifier can use it. ``runner_up`` is the race's second
    place (greedy: the second-highest logit): when the target rejects the
    draft, the likeliest correction under the same noise.
    """
    if params.is_greedy:
        token = int(np.argmax(logits))
        if logits.size < 2:
            return Proposal(token, None, None)
        rest = logits.copy()
        rest[token] = -np.inf
        second = int(np.argmax(rest))
        return Proposal(token, None, second, float(logits[token]) - float(logits[second]))
    if params.sends_q:
        ids, probs = top_candidates(logits, params, limit=max(CANDIDATES, params.draft_top_k))
        q = quantize(probs, params.draft_top_k, params.prob_bits, ids=ids)
        return Proposal(sample_sparse(q, params.seed, position), q, None)
    ids, probs = top_candidates(logits, params, limit=CANDIDATES)
    keys = exponential(params.seed, position, ids, Purpose.SAMPLE) / probs
    order = np.argsort(keys)[:2]
    if order.size < 2 or not np.isfinite(keys[order[1]]):
        return Proposal(int(ids[order[0]]), None, None)
    return Proposal(int(ids[order[0]]), None, int(ids[order[1]]), float(np.log(keys[order[1]] / keys[order[0]])))


def _one_hot(token: int, params: SamplingParams) -> SparseDist:
    return SparseDist(np.array([token]), np.array([1 << params.prob_bits]), params.prob_bits)


def one_hot_block(tokens: Sequence[int], params: SamplingParams) -> DraftBlock:
    """A block of deterministic proposals; in rejection mode each carries a point-mass q̃."""
    tokens = [int(t) for t in tokens]
    q = [_one_hot(t, params) for t in tokens] if params.sends_q else None
    return DraftBlock(tokens, q)
