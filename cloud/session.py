"""One generation's verifier state: committed tokens, KV cache, epoch, counters.

Transport-agnostic: the gRPC servicer and the in-process decoder both drive a
``VerifierSession``. Blocks arrive in chains: a block sent with
``more_follows`` is continued by the next one, so when all its drafts are
accepted no bonus is sampled; the distribution the bonus would come from is
kept and checks the next block's first draft. A chain of pending blocks is
verified in one target forward.

Every block gets exactly one verdict, in order. A block is *stale* when it is
of an older epoch or does not continue the committed tokens: it is answered
unverified, with a *stale decode* (the next token, decoded alone) when no
usable block waits behind it and that forward would be over by the caller's
``stale_decode_deadline`` or its overrun pays
(``cloud.next_block.stale_decode_overrun_pays``); in greedy and coupled modes
that forward also verifies *rebased* drafts where they lie (rejection mode
decodes the token alone: a draft's q̃ holds only on its own path). An empty
block (the cloud decoding alone) gets the next token, and in greedy and coupled
modes that forward also verifies drafts the cloud *proposes* itself from the
committed tokens (``shared.lookup``), as many as the forward holds for the cost
of the token alone (none in free shapes on a CPU), for an edge that takes them
(``Open.takes_proposals``); those accepted ride as the verdict's ``rebased``,
before the token. A block whose
first drafts guess tokens committed since is cut to the drafts past them.
Blocks that break the protocol (an epoch ahead, a position outside the
session's, too long, malformed branches, after the end) are refused with
``BlockRejected``; the session never trusts the caller. In rejection mode so
are drafts not sampled from the q̃ sent with them, and a run of drafts
improbable under their own q̃ (``ForgedDraft``, ``shared.draft_audit``): the
session is then over. Why and how: ``docs/pipelining.md``.

Work that needs the target comes in two forms: ``*_steps`` generators yield
the ``ForwardItem`` they need and are sent its logits (the scheduler packs
many sessions' items into one forward), and the plain methods run the same
steps alone (``run_alone``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from cloud.engine import ForwardItem, Steps, TargetEngine, run_alone
from cloud.next_block import stale_decode_overrun_pays
from cloud.pending_block import (
    MAX_BRANCH_LEN,
    BlockRejected,
    ForgedDraft,
    PendingBlock,
    by_position,
    check_block,
    past,
    past_correction,
    rebased_verdict,
)
from cloud.verify_torch import verify_block
from shared import draft_audit
from shared.lookup import WINDOW, lookup_continuation
from shared.params import Mode, SamplingParams
from shared.sparse import SparseDist
from shared.stats import DecodeStats, Ewma
from shared.verdict import StopReason, Verdict
from shared.wire import committed_skip, next_epoch

__all__ = ["VerifierSession", "BlockRejected", "ForgedDraft", "PendingBlock", "MAX_BRANCH_LEN", "MAX_FREE_DRAFTS"]

# Drafts a forward for the next token verifies beside it on an accelerator (rebased ones or the cloud's own
# proposals), where a decode forward is memory-bound up to tens of rows, so a few more cost next to nothing;
# the cap bounds what each session alone with the cloud adds to a packed forward (on a CPU the row tile
# says how many are free).
MAX_FREE_DRAFTS = 8


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
        max_branches: int = 0,
        decode_stale: bool = True,
        rebase_stale: bool = True,
        propose: bool = False,
        prefill: bool = True,
        audit_drafts: bool = True,
    ) -> None:
        """``prefill``: read the prompt now; False leaves it to ``prefill_steps`` (the scheduler's way).
        ``max_branches``: hedge branches a block may carry (greedy and coupled modes).
        ``decode_stale``: a stale block with no usable block pending behind it gets the next token
        decoded alone (False: it is answered empty, without a forward). ``rebase_stale``: that forward
        also verifies the drafts sent for the next positions past a correction (greedy and coupled).
        ``propose``: the edge takes the cloud's own proposals on an empty block's verdict
        (``Open.takes_proposals``; ``proposes``). ``audit_drafts``: rejection mode refuses drafts not
        sampled from their q̃ (``shared.draft_audit``; False only for tests' controls)."""
        _check_request(engine, prompt, max_new_tokens)
        self.engine = engine
        self.params = params
        self.max_new_tokens = max_new_tokens
        self.max_draft_len = max_draft_len
        # Lowered by ``cap`` for blocks of epochs after ``draft_limit_epoch`` (0: not lowered).
        self.draft_limit = 0
        self.draft_limit_epoch = 0
        self.max_branches = max_branches
        self.decode_stale = decode_stale
        self.rebase_stale = rebase_stale
        self.propose = propose
        self.audit_drafts = audit_drafts
        self.surprise_cusum = 0.0  # the draft audit's CUSUM statistic, nats (rejection mode)
        self.audited = 0  # drafts the audit has scored
        self.tokens = [int(t) for t in prompt]
        self.prompt_len = len(self.tokens)
        self.epoch = 0
        self.done = False
        self.stop_reason = StopReason.NONE
        self.stats = DecodeStats()
        self.seq = engine.new_sequence()
        self.seq.slot.limit = len(self.tokens) + max_new_tokens + max_draft_len  # the most it will ever hold
        self.broken = False  # an extend failed half-way: the cache is inconsistent
        # The cache holds every committed token but the last, which is fed with the next block;
        # after a deferred bonus it holds them all, and ``_deferred`` is the logits row [V] for
        # the next position (what the bonus would have been sampled from). The prefill reads the
        # whole prompt and keeps its last row so: the first position is answered without another
        # forward (the first token can leave right after the prefill, as in cloud-only decoding).
        self.verify_s = 0.0  # wall time inside verify(), forward included
        # The last verify step: the rows this session put in its forward (0: it ran none) and its
        # wall time, forward, verification and sampling included (the service's cost per step).
        self.last_step_rows = 0
        self.last_step_proposed = 0  # ... of them, rows of drafts the cloud proposed itself (no client's)
        self.last_step_proposals_taken = 0  # ... and how many of those it committed
        self.last_step_s = 0.0
        self.one_token_s = Ewma()  # seconds a forward for the next token takes (a stale block's: with rebased drafts)
        self._deferred: torch.Tensor | None = None
        self._taken_branch: tuple[int, int] | None = None  # (position, tokens) of a branch to adopt into the cache
        # Drafts the edge sent for positions past the committed tokens, drafted past a token the target
        # did not pick (position -> id): what a stale block's forward verifies where they lie.
        self._spare: dict[int, int] = {}
        if prefill:
            run_alone(self.prefill_steps(), engine)

    def _item(self, tokens, logits, branches=()) -> ForwardItem:
        """This session's rows for a forward (canonical shapes for the forward when it is reproducible)."""
        return ForwardItem(self.seq, tokens, logits, branches, reproducible=self.params.reproducible)

    def prefill_steps(self) -> Steps:
        """Read the prompt into the cache; its last row answers the first position."""
        # A copy: the forward's logits tensor holds every batch-mate's rows too.
        self._deferred = (yield self._item(self.tokens, "last"))[-1].clone()
        self.stats.target_forwards = self.forwards

    def extend(
        self, keep: int, tokens: Sequence[int], params: SamplingParams, *, max_new_tokens: int, max_draft_len: int
    ) -> None:
        """``extend_steps`` run alone."""
        run_alone(self.extend_steps(keep, tokens, params, max_new_tokens=max_new_tokens, max_draft_len=max_draft_len),
                  self.engine)

    def extend_steps(
        self, keep: int, tokens: Sequence[int], params: SamplingParams, *, max_new_tokens: int, max_draft_len: int,
        propose: bool = False,
    ) -> Steps:
        """A new turn on this session's cache: keep the first ``keep`` committed tokens, append
        ``tokens``, and decode anew (``params``, ``max_new_tokens``, ``max_draft_len``, ``propose``: as
        the turn's Open asks).

        The cache keeps what it holds of the first ``keep`` tokens; the rest is
        prefilled (its last row answers the first position, as after ``__init__``).
        """
        if not 1 <= keep <= len(self.tokens):
            raise ValueError(f"cannot keep {keep} tokens of a session that has {len(self.tokens)}")
        full = self.tokens[:keep] + [int(t) for t in tokens]
        _check_request(self.engine, full, max_new_tokens)
        cached = min(keep, self.seq.length, len(full) - 1)  # at least the last token is fed again
        self.engine.crop(self.seq, cached)
        self.seq.slot.limit = len(full) + max_new_tokens + max_draft_len
        try:
            self._deferred = (yield self._item(full[cached:], "last"))[-1].clone()
        except BaseException:
            self.broken = True  # the cache no longer matches the committed tokens: never verify on it again
            raise
        self.tokens, self.prompt_len = full, len(full)
        self.params, self.max_new_tokens, self.max_draft_len = params, max_new_tokens, max_draft_len
        self.propose = propose
        self.draft_limit = 0  # a new turn starts from the limit it asked for (the caller may lower it again)
        self.epoch, self.done, self.stop_reason = 0, False, StopReason.NONE
        self._spare = {}
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
        """Verify one block (no ``more_follows``) in one target forward and commit its outcome."""
        block = PendingBlock(epoch, start_position, [int(t) for t in drafts], q and list(q))
        if self._overlap(block) is None:
            raise BlockRejected(f"stale block: epoch {epoch} at position {start_position}, the session is at "
                                f"epoch {self.epoch} position {len(self.tokens)}")
        return self.verify_chain([block])[0]

    def verify_chain(self, pending: list[PendingBlock], stale_decode_deadline: float | None = None) -> list[Verdict]:
        """``verify_chain_steps`` run alone."""
        return run_alone(self.verify_chain_steps(pending, stale_decode_deadline), self.engine)

    def verify_chain_steps(self, pending: list[PendingBlock], stale_decode_deadline: float | None = None) -> Steps:
        """Answer the front of ``pending`` and remove what was answered (at least one block).

        A usable front block (``_overlap``), cut to its drafts past the committed
        tokens, and the blocks that continue it (``more_follows``, contiguous, this
        epoch) are verified in one forward; verification walks the chain in order
        and stops at the first correction, bonus or end, leaving the blocks after
        it pending (after a correction they are stale). A stale front block gets a
        stale verdict: with the next token (after the rebased drafts accepted) when
        no usable block is pending behind it and that forward would be over by
        ``stale_decode_deadline`` (``time.perf_counter()`` seconds; None: no deadline) or
        its overrun pays (``stale_decode_overrun_pays``), without one (and no forward)
        otherwise.
        """
        if self.done:
            raise BlockRejected("session already finished")
        if self.broken:
            raise BlockRejected("the session's last turn failed half-way; reopen it")
        if not pending:
            return []
        self.last_step_rows = self.last_step_proposed = self.last_step_proposals_taken = 0
        front = pending[0]
        self._check(front)
        skip = self._overlap(front)
        if skip is None:
            if self.rebases:
                self._spare.update(by_position(front.start_position, front.drafts))
            if not self._decodes_stale(pending, stale_decode_deadline):
                del pending[0]
                return [Verdict(front.epoch, len(self.tokens), 0, None, False, False, stale=True)]
            chain = [PendingBlock(self.epoch, len(self.tokens), self._rebased())]  # the next token, and drafts where they lie
        else:  # (an empty block: the cloud decodes alone, with what it proposes itself)
            chain = [past(front, skip) if front.drafts else PendingBlock(self.epoch, len(self.tokens), self._proposals())]
            self.last_step_proposed = 0 if front.drafts else len(chain[0].drafts)
            position = chain[0].start_position + len(chain[0].drafts)
            for block in pending[1:]:
                if not chain[-1].more_follows or block.epoch != self.epoch or block.start_position != position:
                    break
                self._check(block)
                chain.append(block)
                position += len(block.drafts)
        scores = [self._check_sampled(block) for block in chain]  # before the forward: a forgery costs no work
        started = time.perf_counter()
        drafts = [t for block in chain for t in block.drafts]
        branches = [(block.start_position + at, tokens) for block in chain for at, tokens in block.branches]
        # [len(drafts) + 1, V]: one per drafted position, then one more; and each branch's rows
        rows, branch_rows = yield from self._distributions(drafts, branches)
        verdicts, offset, first_branch = [], 0, 0
        for block, surprise in zip(chain, scores):
            n = len(block.drafts)
            mine = branch_rows[first_branch : first_branch + len(block.branches)]
            verdict = self._verify_one(block, rows[offset : offset + n + 1], mine, rebased=skip is None,
                                       proposed=not front.drafts, surprise=surprise)
            verdicts.append(verdict)
            offset += n
            first_branch += len(block.branches)
            if not verdict.is_deferred:
                break
        self._settle(rows[offset] if verdicts[-1].is_deferred else None)
        del pending[: len(verdicts)]
        if skip is None:
            verdicts = [rebased_verdict(verdicts[0], front.epoch, chain[0].drafts)]
        elif not front.drafts:
            verdicts = [rebased_verdict(verdicts[0], front.epoch, chain[0].drafts, stale=False)]
            self.last_step_proposals_taken = len(verdicts[0].rebased)
            self._spare = {}
        elif self.rebases:
            self._spare = past_correction(chain[len(verdicts) - 1], verdicts[-1])
        elapsed = time.perf_counter() - started
        if (skip is None or not front.drafts) and self.forwards > self.stats.target_forwards:  # the next token, in a forward
            self.one_token_s.add(elapsed)
        self.last_step_s = elapsed
        self.stats.target_forwards = self.forwards
        self.verify_s += elapsed
        self.stats.wall_s += elapsed
        return verdicts

    def cap(self, limit: int) -> bool:
        """The session's client has its drafts accepted next to never: hold its blocks of every later
        epoch to ``limit`` drafts, guesses included (blocks of this epoch or an earlier one keep the old
        limit: the edge drafted them before it could know), and answer its stale blocks without a
        forward. Never raises a limit; True when this lowered it."""
        self.decode_stale = False
        if not 1 <= limit < self.current_draft_limit:
            return False
        self.draft_limit, self.draft_limit_epoch = limit, self.epoch
        return True

    @property
    def current_draft_limit(self) -> int:
        """Drafts per block the edge is held to from now on."""
        return self.draft_limit or self.max_draft_len

    def draft_limit_for(self, epoch: int) -> int:
        """The most drafts a block of ``epoch`` may hold."""
        return self.draft_limit if self.draft_limit and epoch > self.draft_limit_epoch else self.max_draft_len

    # -- internals ---------------------------------------------------------
    @property
    def rebases(self) -> bool:
        """Whether stale blocks' forwards verify spare drafts: greedy and coupled modes only (a
        draft's q̃ in rejection mode is the drafter's on the path it was drafted on)."""
        return self.decode_stale and self.rebase_stale and self.params.mode is not Mode.REJECTION

    def _rebased(self) -> list[int]:
        """The spare drafts from the next position on, as many as lie there in a row, at most
        ``_free_drafts`` (what the forward holds for the cost of the token alone); none when a deferred
        row makes the token free of a forward."""
        self._spare = {p: t for p, t in self._spare.items() if p >= len(self.tokens)}
        if not self.rebases or self._deferred is not None:
            return []
        most = self._free_drafts()
        drafts = []
        while len(drafts) < most and len(self.tokens) + len(drafts) in self._spare:
            drafts.append(self._spare[len(self.tokens) + len(drafts)])
        return drafts

    def _free_drafts(self) -> int:
        """Drafts a forward for the next token may verify for about its cost: what its rows are padded
        to anyway on a CPU (``TargetEngine.rows_at_cost_of``), ``MAX_FREE_DRAFTS`` on an accelerator,
        within the session's draft limit."""
        free = self.engine.rows_at_cost_of(1, self.params.reproducible)
        return min(self.current_draft_limit, MAX_FREE_DRAFTS if free is None else free - 1)

    @property
    def proposes(self) -> bool:
        """Whether the forwards of the cloud decoding alone verify drafts it proposes itself: greedy and
        coupled modes (a proposal has no q̃), for an edge that takes them (``Open.takes_proposals``)."""
        return self.propose and self.params.mode is not Mode.REJECTION

    def _proposals(self) -> list[int]:
        """Drafts the cloud proposes for an empty block: what followed the latest earlier occurrence of
        the committed tokens' last few (``shared.lookup``), as many as ``_free_drafts`` and the token
        limit leave room for (none in free shapes on a CPU); none when a deferred row makes the token
        free of a forward."""
        if not self.proposes or self._deferred is not None:
            return []
        room = min(self._free_drafts(), self.max_new_tokens - self.generated - 1)
        return lookup_continuation(self.tokens, room, window=WINDOW)

    def _decodes_stale(self, pending: list[PendingBlock], deadline: float | None) -> bool:
        """Whether the stale block at the front of ``pending`` gets the next token: the service decodes
        for stale blocks, no usable block waits behind it, and the forward (none after a deferred
        bonus) would be over by ``deadline``, or its overrun pays (``stale_decode_overrun_pays``)."""
        if not self.decode_stale or any(self._overlap(block) is not None for block in pending[1:]):
            return False
        if deadline is None or self._deferred is not None:
            return True
        now = time.perf_counter()
        overrun = now + (self.one_token_s.value or 0.0) - deadline
        if overrun <= 0:
            return True
        return self.params.mode is not Mode.REJECTION and stale_decode_overrun_pays(overrun, deadline - now, self._guess_odds())

    def _guess_odds(self) -> float:
        """How often a block's first draft is accepted: the odds that the edge's guess of the token a
        stale block's forward decodes holds (greedy and coupled modes: that token is the one verifying
        the guess would commit). Laplace's rule over this session's blocks (1/2 before any)."""
        drafted = self.stats.drafted_at[0] if self.stats.drafted_at else 0
        accepted = self.stats.accepted_at[0] if self.stats.accepted_at else 0
        return (accepted + 1) / (drafted + 2)

    def _check(self, block: PendingBlock) -> None:
        check_block(block, epoch=self.epoch, first=self.prompt_len, last=self.prompt_len + self.max_new_tokens,
                    max_draft_len=self.draft_limit_for(block.epoch), max_branches=self.max_branches)

    def _check_sampled(self, block: PendingBlock) -> np.ndarray | None:
        """Refuse rejection-mode drafts that are not the token their q̃ yields under this session's DRAFT
        noise (``draft_audit.audit_block``; the session is over); else their scores [n] (None: not audited)."""
        if block.q is None or not self.audit_drafts or not block.drafts:
            return None
        audit = draft_audit.audit_block(block.drafts, block.q, self.params.seed, block.start_position)
        if audit.unsampled is not None:
            self.broken = True
            raise ForgedDraft(f"{draft_audit.NOT_SAMPLED} (position {block.start_position + audit.unsampled})",
                              "unsampled")
        return audit.scores

    def _audit_surprise(self, block: PendingBlock, scores: np.ndarray) -> None:
        """Add the scores of the drafts verification examined (the block's first ones) to the session's
        CUSUM; past the threshold the session is over (``draft_audit``)."""
        self.surprise_cusum, crossed = draft_audit.cusum(self.surprise_cusum, scores)
        self.audited += len(scores)
        if crossed is not None:
            self.broken = True
            raise ForgedDraft(
                f"{draft_audit.IMPROBABLE}: their surprise exceeds what the q̃ imply by {self.surprise_cusum:.1f} "
                f"nats (limit {draft_audit.THRESHOLD:.1f}) at position {block.start_position + crossed}",
                "improbable",
            )

    def _overlap(self, block: PendingBlock) -> int | None:
        """How many of ``block``'s drafts the committed tokens already hold, when it is usable: of
        this epoch, starting at or before the next position, its drafts up to there equal to the
        committed tokens, with drafts past them (an empty block: any of this epoch). None: stale."""
        if block.epoch != self.epoch:
            return None
        if not block.drafts:
            return 0  # it asks for the next token, wherever the edge thought that was
        return committed_skip(block.start_position, block.drafts, self.tokens)

    def _distributions(self, drafts: list[int], branches: list[tuple[int, list[int]]]) -> Steps:
        """Logits [len(drafts) + 1, V] for the positions len(tokens) .. len(tokens) + len(drafts),
        and per branch (absolute position p, its k tokens) its rows [k, V] for positions p+1 .. p+k.

        One forward over what the cache lacks (the last committed token unless a
        bonus was deferred), the drafts and the branches; a deferred row stands for
        the first position. A deferred row and no drafts need no forward at all.
        """
        feed = drafts if self._deferred is not None else [self.tokens[-1], *drafts]
        parts = [] if self._deferred is None else [self._deferred[None]]
        branch_rows = []
        if feed:
            self.last_step_rows = len(feed) + sum(len(tokens) for _, tokens in branches)
            out = yield self._item(feed, "all", branches)
            parts.append(out[: len(feed)])
            offset = len(feed)
            for _, tokens in branches:
                branch_rows.append(out[offset : offset + len(tokens)])
                offset += len(tokens)
        return (torch.cat(parts) if len(parts) > 1 else parts[0]), branch_rows

    def _verify_one(self, block: PendingBlock, logits: torch.Tensor, branch_rows: list[torch.Tensor],
                    rebased: bool = False, proposed: bool = False, surprise: np.ndarray | None = None) -> Verdict:
        """Verify one block against its rows [n+1, V] (and its branches' rows) and commit what it decides.
        ``rebased``: its drafts are a stale block's spare ones; ``proposed``: the cloud's own for an empty
        block (neither corrects a block of the edge's). ``surprise`` [n]: its drafts' audit scores
        (rejection mode, ``_check_sampled``).

        At a rejection whose correction is a branch's first token, the branch's
        later tokens are verified as drafts after it (its rows are the target's
        on exactly that path), so what is committed is what the target alone
        would have decoded.
        """
        drafts = block.drafts
        result = verify_block(self.params, drafts, logits, block.start_position, block.q)
        if surprise is not None:  # the drafts verification examined, before anything is committed
            self._audit_surprise(block, surprise[: result.accepted + (not result.bonus)])
        deferred = result.bonus and block.more_follows
        committed = [*drafts[: result.accepted]] + ([] if deferred else [result.token])
        taken = None  # (branch number, the verification of its continuation)
        for number, ((at, tokens), rows) in enumerate(zip(block.branches, branch_rows), start=1):
            if not result.bonus and at == result.accepted and tokens[0] == result.token:
                tail = verify_block(self.params, tokens[1:], rows, block.start_position + at + 1)
                committed += [*tokens[1 : 1 + tail.accepted], tail.token]
                taken = (number, tail)
                break
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
        branch = branch_accepted = 0
        if taken is not None and end > accepted + 1:  # more than the correction itself came from the branch
            branch, tail = taken
            branch_accepted = min(tail.accepted, end - accepted - 1)
            token = committed[-1] if end > accepted + 1 + branch_accepted else None
            bonus = tail.bonus and token is not None
            position = block.start_position + accepted  # the branch's first token; its keys go into the cache
            self._taken_branch = (position, len(self.tokens) + end - 1 - position)
        else:
            token = committed[-1] if end > accepted else None
            bonus = result.bonus and token is not None
        self.tokens.extend(committed)
        self.done = self.stop_reason is not StopReason.NONE
        verdict = Verdict(
            epoch=block.epoch,
            start_position=block.start_position,
            accepted=accepted,
            token=token,
            bonus=bonus,
            done=self.done,
            stop_reason=self.stop_reason,
            branch=branch,
            branch_accepted=branch_accepted,
        )
        if rebased:  # a stale block's forward: no block of the edge's was corrected
            self.stats.record_stale(len(committed), accepted, len(drafts))
            return verdict
        if proposed:  # the cloud decoding alone, its own proposals verified on the way
            self.stats.record_round(0, 0, len(committed))
            self.stats.record_proposals(len(drafts), accepted)
            return verdict
        self.epoch = next_epoch(self.epoch, verdict)
        self.stats.record_round(len(drafts), accepted, len(committed))
        return verdict

    def _settle(self, deferred_row: torch.Tensor | None) -> None:
        """Cut the cache back to the committed state after a chain."""
        if self._taken_branch is not None:  # the cache holds the branch's tokens, all committed but the last
            position, count = self._taken_branch
            self._taken_branch = None
            self._deferred = None
            self.engine.adopt_branch(self.seq, position, count)
            return
        if deferred_row is not None:  # every committed token is in the cache; keep the next position's row
            self._deferred = deferred_row.clone()
            self.engine.crop(self.seq, len(self.tokens))
        else:
            self._deferred = None
            self.engine.crop(self.seq, len(self.tokens) - 1)  # everything but the new pending token


def _check_request(engine: TargetEngine, prompt: Sequence[int], max_new_tokens: int) -> None:
    """A prompt and token budget the target can take, else ``ValueError``."""
    if not prompt:
        raise ValueError("prompt must hold at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    bad = [t for t in prompt if not 0 <= t < engine.vocab_size]
    if bad:
        raise ValueError(f"prompt token {bad[0]} is outside the vocabulary of {engine.vocab_size}")
    if engine.max_positions and len(prompt) + max_new_tokens > engine.max_positions:
        raise ValueError(
            f"a prompt of {len(prompt)} tokens plus {max_new_tokens} new ones exceeds the target's context of "
            f"{engine.max_positions} positions"
        )
