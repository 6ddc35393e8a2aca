"""One generation's verifier state: committed tokens, KV cache, epoch, counters, and its verify step.

Transport-agnostic: the gRPC servicer and the in-process decoder both drive a ``VerifierSession``. A
chain of pending blocks (each sent with ``more_follows`` continued by the next; no bonus is sampled
inside a chain, its distribution checks the next block's first draft) is verified in one forward of
``SessionPolicy.max_rows`` at most. Every block gets exactly one verdict, in order. A *stale* block (an
older epoch, or drafts that do not continue the committed tokens) is answered unverified, or with a
*stale decode* (the next token, decoded alone) when ``cloud.next_block.decodes_stale`` says so; in
greedy and coupled modes that forward also verifies *rebased* drafts where they lie. An empty block
gets the next token, with the cloud's own *proposals* verified on the way for an edge that takes them
(``cloud.spare_drafts``); accepted ones ride as the verdict's ``rebased``. A block whose first drafts
guess tokens committed since is cut to the drafts past them. A block that breaks the protocol is
refused with ``BlockRejected``; in rejection mode so are drafts not sampled from their q̃
(``ForgedDraft``, ``cloud.audit_state``), which end the session. The session never trusts the caller.
Why and how: ``docs/pipelining.md``.

Rooms of their own: drafts per block (``cloud.draft_limit``), the audit (``cloud.audit_state``), spare
drafts (``cloud.spare_drafts``), the stale-decode rule (``cloud.next_block``), decoding ahead of the
edge's next block (``cloud.decode_ahead``). A step's measurements come back in its ``StepResult``
(``cloud.step_result``), never as fields left on the session. ``*_steps`` generators yield the
``ForwardItem`` they need and are sent its logits (the scheduler packs many sessions' items into one
forward); the plain methods run them alone.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from cloud.audit_state import DraftAuditState
from cloud.decode_ahead import DecodedAhead
from cloud.draft_limit import DraftLimit
from cloud.engine import ForwardItem, Steps, TargetEngine, run_alone
from cloud.next_block import decodes_stale
from cloud.pending_block import (
    MAX_BRANCH_LEN,
    BlockRejected,
    ForgedDraft,
    PendingBlock,
    check_block,
    check_request,
    past,
    past_correction,
    rebased_verdict,
    shares_forward,
    usable,
)
from cloud.session_policy import SessionPolicy
from cloud.spare_drafts import MAX_FREE_DRAFTS, SpareDrafts, free_drafts
from cloud.step_result import StepResult
from cloud.verify_torch import verify_block
from shared.lookup import WINDOW, lookup_continuation
from shared.params import Mode, SamplingParams
from shared.sparse import SparseDist
from shared.stats import DecodeStats, Ewma
from shared.verdict import StopReason, Verdict, end_within, token_follows
from shared.wire import committed_skip, next_epoch

__all__ = ["VerifierSession", "SessionPolicy", "BlockRejected", "ForgedDraft", "PendingBlock", "StepResult",
           "MAX_BRANCH_LEN", "MAX_FREE_DRAFTS"]

DEFAULT_POLICY = SessionPolicy()  # what the service does by default beyond verifying


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
        policy: SessionPolicy = DEFAULT_POLICY,
        prefill: bool = True,
    ) -> None:
        """``prefill``: read the prompt now; False leaves it to ``prefill_steps`` (the scheduler's way).
        ``policy``: what the service does beyond verifying (``SessionPolicy``)."""
        check_request(engine.vocab_size, engine.max_positions, prompt, max_new_tokens)
        self.engine = engine
        self.params = params
        self.max_new_tokens = max_new_tokens
        self.draft_limit = DraftLimit(max_draft_len)  # lowered by ``penalise``
        self.policy = policy
        self.audit = DraftAuditState(policy.audit_drafts)  # rejection mode
        self.tokens = [int(t) for t in prompt]
        self.prompt_len = len(self.tokens)
        self.epoch, self.done, self.stop_reason = 0, False, StopReason.NONE
        self.stats = DecodeStats()
        self.seq = engine.new_sequence()
        self.seq.slot.limit = len(self.tokens) + max_new_tokens + max_draft_len  # the most it will ever hold
        self.broken = False  # an extend failed half-way: the cache is inconsistent
        # The cache holds every committed token but the last, fed with the next block; after a deferred
        # bonus it holds them all, and ``_deferred`` is the logits row [V] for the next position. The
        # prefill keeps its last row so: the first token can leave right after it, as in cloud-only decoding.
        self.verify_s = 0.0  # wall time inside verify(), forward included
        self.one_token_s = Ewma()  # seconds a forward for the next token takes (a stale block's: with rebased drafts)
        self._deferred: torch.Tensor | None = None
        self._taken_branch: tuple[int, int] | None = None  # (position, tokens) of a branch to adopt into the cache
        self._spare = SpareDrafts()  # what a stale block's forward verifies where they lie
        self.ahead = DecodedAhead()  # tokens decoded before the edge's next block came (``cloud.decode_ahead``)
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
        propose: bool = False, ahead: bool = False, tell_end: bool = False,
    ) -> Steps:
        """A new turn on this session's cache: keep the first ``keep`` committed tokens, append
        ``tokens``, and decode anew (``params``, ``max_new_tokens``, ``max_draft_len``, ``propose``, ``ahead``,
        ``tell_end``: as the turn's Open asks).

        The cache keeps what it holds of the first ``keep`` tokens; the rest is
        prefilled (its last row answers the first position, as after ``__init__``).
        """
        if not 1 <= keep <= len(self.tokens):
            raise ValueError(f"cannot keep {keep} tokens of a session that has {len(self.tokens)}")
        full = self.tokens[:keep] + [int(t) for t in tokens]
        check_request(self.engine.vocab_size, self.engine.max_positions, full, max_new_tokens)
        cached = min(keep, self.seq.length, len(full) - 1)  # at least the last token is fed again
        self.engine.crop(self.seq, cached)
        self.seq.slot.limit = len(full) + max_new_tokens + max_draft_len
        try:
            self._deferred = (yield self._item(full[cached:], "last"))[-1].clone()
        except BaseException:
            self.broken = True  # the cache no longer matches the committed tokens: never verify on it again
            raise
        self.tokens, self.prompt_len = full, len(full)
        self.params, self.max_new_tokens = params, max_new_tokens
        self.policy = replace(self.policy, propose=propose, decode_ahead=ahead, tell_end=tell_end)
        self.draft_limit.reopen(max_draft_len)  # a new turn starts from the limit it asked for
        self.epoch, self.done, self.stop_reason = 0, False, StopReason.NONE
        self._spare.clear()
        self.ahead.clear()
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
        """The verdicts of ``verify_chain_steps`` run alone."""
        return run_alone(self.verify_chain_steps(pending, stale_decode_deadline), self.engine).verdicts

    def verify_chain_steps(self, pending: list[PendingBlock], stale_decode_deadline: float | None = None) -> Steps:
        """Answer the front of ``pending`` and remove what was answered (at least one block).

        A usable front block (``_overlap``), cut to its drafts past the committed tokens, and the blocks
        that continue it (``more_follows``, contiguous, this epoch) are verified in one forward;
        verification walks the chain in order and stops at the first correction, bonus or end, leaving
        the blocks after it pending (after a correction they are stale). A stale front block gets a stale
        verdict: with the next token (after the rebased drafts accepted) when no usable block is pending
        behind it and that forward would be over by ``stale_decode_deadline`` (``time.perf_counter()``
        seconds; None: no deadline) or its overrun pays (``stale_decode_overrun_pays``), without one (and
        no forward) otherwise. The first verdict tells the tokens decoded ahead (``DecodedAhead.fold``).
        Returns the step's ``StepResult`` (at least one verdict).
        """
        if self.done and not self.ahead:
            raise BlockRejected("session already finished")
        if self.broken:
            raise BlockRejected("the session's last turn failed half-way; reopen it")
        if not pending:
            return StepResult()
        front = pending[0]
        self._check(front)
        if self.done:  # tokens decoded ahead ended it: this block's verdict tells them
            del pending[0]
            return StepResult([self.ahead.end(front.epoch, len(self.tokens), self.stop_reason)])
        skip = self._overlap(front)
        if skip is None:
            if self.rebases:
                self._spare.add(front.start_position, front.drafts)
            if not self._decodes_stale(pending, stale_decode_deadline):
                del pending[0]
                return StepResult([self.ahead.fold(Verdict(front.epoch, len(self.tokens), 0, None, False, False,
                                                           stale=True), verified=False)])
            chain = [PendingBlock(self.epoch, len(self.tokens), self._rebased())]  # the next token, and drafts where they lie
        else:  # (an empty block: the cloud decodes alone, with what it proposes itself)
            chain = [past(front, skip) if front.drafts else PendingBlock(self.epoch, len(self.tokens), self._proposals())]
            position = chain[0].start_position + len(chain[0].drafts)
            rows = self._rows_fed(chain[0].drafts, list(chain[0].branches))
            for block in pending[1:]:  # past max_rows, the rest goes in the next forward (the bonus row deferred)
                rows += len(block.drafts) + sum(len(tokens) for _, tokens in block.branches)
                if (not shares_forward(chain[-1].more_follows, position, self.epoch, block.start_position, block.epoch)
                        or self.policy.max_rows and rows > self.policy.max_rows):
                    break
                self._check(block)
                chain.append(block)
                position += len(block.drafts)
        try:  # before the forward: a forgery costs no work
            scores = [self.audit.check_sampled(block, self.params.seed) for block in chain]
        except ForgedDraft:
            self.broken = True
            raise
        started = time.perf_counter()
        drafts = [t for block in chain for t in block.drafts]
        branches = [(block.start_position + at, tokens) for block in chain for at, tokens in block.branches]
        fed = self._rows_fed(drafts, branches)
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
        self._crop_cache(rows[offset] if verdicts[-1].is_deferred else None)
        del pending[: len(verdicts)]
        proposed = len(chain[0].drafts) if skip is not None and not front.drafts else 0
        if skip is None:
            verdicts = [rebased_verdict(verdicts[0], front.epoch, chain[0].drafts)]
        elif not front.drafts:
            verdicts = [rebased_verdict(verdicts[0], front.epoch, chain[0].drafts, stale=False)]
            self._spare.clear()
        elif self.rebases:
            self._spare.replace(past_correction(chain[len(verdicts) - 1], verdicts[-1]))
        taken = len(verdicts[0].rebased) if proposed else 0
        verdicts[0] = self.ahead.fold(verdicts[0], verified=skip is not None and bool(front.drafts))
        elapsed = time.perf_counter() - started
        if (skip is None or not front.drafts) and self.forwards > self.stats.target_forwards:  # the next token, in a forward
            self.one_token_s.add(elapsed)
        self.stats.target_forwards = self.forwards
        self.verify_s += elapsed
        self.stats.wall_s += elapsed
        return StepResult(verdicts, rows=fed, proposed=proposed, proposals_taken=taken,
                          drafts=len(drafts) + sum(len(tokens) for _, tokens in branches) - proposed, seconds=elapsed)

    def penalise(self, draft_limit: int) -> bool:
        """Fair share's penalty: the session's client has its drafts accepted next to never. Hold its
        blocks of every later epoch to ``draft_limit`` drafts, guesses included (``DraftLimit.lower``),
        and answer its stale blocks without a forward. True when this lowered the limit."""
        self.policy = replace(self.policy, decode_stale=False)
        return self.draft_limit.lower(draft_limit, self.epoch)

    # -- internals ---------------------------------------------------------
    @property
    def rebases(self) -> bool:
        """Whether stale blocks' forwards verify spare drafts: greedy and coupled modes only (a
        draft's q̃ in rejection mode is the drafter's on the path it was drafted on)."""
        return self.policy.decode_stale and self.policy.rebase_stale and self.params.mode is not Mode.REJECTION

    def _rebased(self) -> list[int]:
        """The spare drafts from the next position on (``SpareDrafts.run_from``), as many as ride free;
        none when a deferred row makes the token free of a forward."""
        if not self.rebases or self._deferred is not None:
            return []
        return self._spare.run_from(len(self.tokens), self.drafts_at_no_cost())

    def drafts_at_no_cost(self) -> int:
        """Drafts a forward for the next token verifies at about its cost (``free_drafts``, ``DraftLimit.beside``)."""
        return free_drafts(self.engine.rows_at_cost_of(1, self.params.reproducible), self.draft_limit.beside(len(self.ahead)))

    @property
    def proposes(self) -> bool:
        """Whether the forwards of the cloud decoding alone verify drafts it proposes itself: greedy and
        coupled modes (a proposal has no q̃), for an edge that takes them (``Open.takes_proposals``)."""
        return self.policy.propose and self.params.mode is not Mode.REJECTION

    def _proposals(self) -> list[int]:
        """Drafts the cloud proposes for an empty block: what followed the latest earlier occurrence of
        the committed tokens' last few (``shared.lookup``), as many as ``drafts_at_no_cost`` and the token
        limit allow (none in free shapes on a CPU); none when a deferred row makes the token
        free of a forward."""
        if not self.proposes or self._deferred is not None:
            return []
        most = min(self.drafts_at_no_cost(), self.max_new_tokens - self.generated - 1)
        return lookup_continuation(self.tokens, most, window=WINDOW)

    def _decodes_stale(self, pending: list[PendingBlock], deadline: float | None) -> bool:
        """Whether the stale block at the front of ``pending`` gets the next token
        (``cloud.next_block.decodes_stale``; after a deferred bonus it needs no forward, so no deadline)."""
        return decodes_stale(
            enabled=self.policy.decode_stale, usable_behind=any(self._overlap(block) is not None for block in pending[1:]),
            now=time.perf_counter(), forward_s=self.one_token_s.value or 0.0,
            deadline=None if self._deferred is not None else deadline,
            may_overrun=self.params.mode is not Mode.REJECTION, guess_odds=self.guess_odds())

    def guess_odds(self) -> float:
        """How often a block's first draft is accepted: the odds that the edge's guess of the token a
        stale block's forward decodes holds (greedy and coupled modes: that token is the one verifying
        the guess would commit). Laplace's rule over this session's blocks (1/2 before any)."""
        drafted = self.stats.drafted_at[0] if self.stats.drafted_at else 0
        accepted = self.stats.accepted_at[0] if self.stats.accepted_at else 0
        return (accepted + 1) / (drafted + 2)

    def _check(self, block: PendingBlock) -> None:
        check_block(block, epoch=self.epoch, first=self.prompt_len, last=self.prompt_len + self.max_new_tokens,
                    max_draft_len=self.draft_limit.for_epoch(block.epoch), max_branches=self.policy.max_branches)

    def _overlap(self, block: PendingBlock) -> int | None:
        """How many of ``block``'s drafts the committed tokens already hold, when it is usable: of this epoch,
        at or before the position the edge was last told of (no branches while tokens decoded ahead are held),
        its drafts up to the next position equal to the committed tokens, with drafts past them. None: stale."""
        same_epoch, empty, start = block.epoch == self.epoch, not block.drafts, block.start_position
        told = start <= self.ahead.told_from(len(self.tokens)) and not (block.branches and self.ahead)
        skip = None if empty or not same_epoch or not told else committed_skip(start, block.drafts, self.tokens)
        if not usable(same_epoch=same_epoch, empty=empty, drafts_continue=skip is not None):
            return None
        return 0 if empty else skip  # (empty: it asks for the next token, wherever the edge thought that was)

    def _rows_fed(self, drafts: list[int], branches: list[tuple[int, list[int]]]) -> int:
        """The rows ``_distributions`` puts in a forward for these drafts and branches (0: none)."""
        fed = len(drafts) + (self._deferred is None)
        return fed + sum(len(tokens) for _, tokens in branches) if fed else 0

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
        (rejection mode, ``DraftAuditState.check_sampled``). At a rejection whose correction is a branch's
        first token, the branch's later tokens are verified as drafts after it (its rows are the target's
        on exactly that path), so what is committed is what the target alone would have decoded.
        """
        drafts = block.drafts
        result = verify_block(self.params, drafts, logits, block.start_position, block.q, self.policy.coin_key)
        if surprise is not None:  # the drafts verification examined, before anything is committed
            try:
                self.audit.add_surprise(block, surprise[: result.accepted + (not result.bonus)])
            except ForgedDraft:
                self.broken = True
                raise
        committed = [*drafts[: result.accepted]]
        if token_follows(result.accepted, len(drafts), block.more_follows):
            committed.append(result.token)
        taken = None  # (branch number, the verification of its continuation)
        for number, ((at, tokens), rows) in enumerate(zip(block.branches, branch_rows), start=1):
            if not result.bonus and at == result.accepted and tokens[0] == result.token:
                tail = verify_block(self.params, tokens[1:], rows, block.start_position + at + 1)
                committed += [*tokens[1 : 1 + tail.accepted], tail.token]
                taken = (number, tail)
                break
        # An EOS or the token limit may end the generation inside the block.
        end, self.stop_reason = end_within(committed, self.engine.eos_token_ids, self.max_new_tokens - self.generated)
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

    def _crop_cache(self, deferred_row: torch.Tensor | None) -> None:
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

