"""The edge's lossless loop: draft blocks, have them verified, commit, repeat.

Up to ``window`` blocks are in flight: while one is verified, the next is
drafted from the drafter's own unverified tokens and sent with
``more_follows`` on the one before it (``window`` 1 is lock-step). A
correction voids every later block in flight: they were drafted at the old
epoch, so the verifier answers each as stale, with the next token decoded
while it has no usable block (after the drafts sent for those positions that
it accepts where they lie: ``Verdict.rebased``). The loop drafts again from
the committed prefix plus the correction at once, the first drafts of the new
block guessing the tokens those stale blocks will bring (the verifier skips
the ones that match; when they bring more than the block holds, or one it
guessed wrong, everything in flight is void and the loop drafts again).
A verdict that arrives while a block is drafted is read before the next
draft (``VerifierConnection.ready``): one that voids the block ends its
drafting there, and it is not sent (a weak drafter on a slow device used to
spend most of its time on such blocks: measured, 432 tokens drafted for 64
committed); otherwise drafting goes on. Randomness is keyed by absolute
position, so where drafting pauses or restarts never changes the output.

Transport-agnostic: a ``VerifierConnection`` is answered in-process
(``sim.inprocess``) or over gRPC (``edge.grpc_verifier``). The loop trusts only
verdicts that answer the oldest block in flight, and stops at ``done``.

A broken link (``LinkLost``) does not end the generation: the connection
resumes the session (``VerifierConnection.resume``) and the loop adopts the
verifier's state: the tokens it committed in verdicts lost in the cut, its
epoch; everything in flight is dropped and drafted again. The verifier's
state alone decides what is committed, so nothing is committed twice, and
position-keyed randomness makes the output that of an unbroken run.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Sequence

from edge.drafter import DraftBlock, Drafter, common_prefix_length
from edge.early_block import EARLY_DRAFT_LEN, EarlyBlock
from edge.hedging import BRANCH_LEN, hedge
from edge.in_flight import Drafting, InFlight, branch_gain, describe_verdict, first_live_continues, guesses_of
from edge.opening import asked_draft_len
from edge.pipeline import (
    LiveVerdict,
    Pipeline,
    StaleVerdict,
    more_follows,
    observe_stale_verdict,
    observe_verdict,
)
from edge.schedule import FixedSchedule, SpecConfig
from edge.speculation_cache import SpeculationCache
from edge.verdict_checks import check_answers
from edge.verifier_protocol import (
    GenerationResult,
    LinkLost,
    ProtocolError,
    Received,
    Resumption,
    SessionTerms,
    VerifierConnection,
    VerifierError,
)
from shared.params import Mode, SamplingParams
from shared.stats import DecodeStats
from shared.verdict import StopReason, Verdict
from shared.wire import next_epoch

__all__ = [
    "VerifierConnection",
    "SessionTerms",
    "Resumption",
    "GenerationResult",
    "run_decode",
    "SpecConfig",
    "ProtocolError",
    "VerifierError",
    "LinkLost",
]

log = logging.getLogger(__name__)


def run_decode(
    drafter: Drafter,
    verifier: VerifierConnection,
    prompt: Sequence[int],
    params: SamplingParams,
    *,
    max_new_tokens: int,
    spec: SpecConfig,
    on_tokens: Callable[[list[int]], bool | None] | None = None,
) -> GenerationResult:
    """Generate up to ``max_new_tokens`` tokens as ``spec`` says (``SpecConfig(0)``: target-only
    decoding). With a controller, a draft length of 0 has the cloud decode alone: empty blocks, a window
    of them in flight, with the drafter's would-be proposals measured in the shadow.
    ``on_tokens`` sees each verdict's committed tokens as soon as they are final;
    when it returns True the generation stops there (``StopReason.STOP``).
    """
    return _Decode(drafter, verifier, prompt, params, spec, max_new_tokens, on_tokens).run()


class _Decode:
    """One ``run_decode`` call: the generation's state around its ``edge.pipeline.Pipeline``."""

    def __init__(self, drafter: Drafter, verifier: VerifierConnection, prompt: Sequence[int],
                 params: SamplingParams, spec: SpecConfig, max_new_tokens: int,
                 on_tokens: Callable[[list[int]], bool | None] | None) -> None:
        self.drafter, self.verifier, self.params, self.on_tokens = drafter, verifier, params, on_tokens
        self.prompt = [int(t) for t in prompt]
        self.max_new_tokens = max_new_tokens
        self.started = time.perf_counter()
        self.stats = DecodeStats()
        self.generated: list[int] = []
        self.epoch, self.ttft, self.stop = 0, 0.0, StopReason.NONE
        # The caller's caps: drafts per block and hedge branches (a resumed session may allow other terms;
        # rejection mode's blocks carry q̃: ``hedge`` skips them).
        self.caps = (spec.draft_len, spec.hedge_width)
        self.pipeline: Pipeline[InFlight] = Pipeline(spec.draft_len, spec.window, spec.schedule(),
                                                     draft_limit=spec.draft_len)
        self.drafting: Drafting | None = None  # the block being drafted, when drafting stopped to read a verdict
        self.early: EarlyBlock | None = None
        self.kept_early = False
        self.early_guess: int | None = None  # the first token the kept early block was drafted on, until read
        self.last_arrival = time.perf_counter()
        self.cache = SpeculationCache(spec.speculation_cache)  # restarts after corrections

    @property
    def guesses_are_trials(self) -> bool:
        """A chain's first block's drafts at tokens decoded for stale blocks are acceptance trials where a
        draft is accepted exactly when it is the target's token (rejection mode accepts by odds)."""
        return self.params.is_greedy or self.params.mode is not Mode.REJECTION

    @property
    def committed_end(self) -> int:
        return len(self.prompt) + len(self.generated)

    def run(self) -> GenerationResult:
        # While the prefill runs, the first block is drafted on a thread (lock-step keeps one block at a
        # time: none); the connection sends it if it is ready before the Opened (``edge.early_block``).
        # Where the round trip is long for the cloud's pace, the cloud decodes alone from the start: empty
        # blocks go right behind the Open instead (``head_start``).
        pipe, drafts_left = self.pipeline, self.max_new_tokens - 2  # the first token, then the correction or bonus
        head_start = self._head_start()
        if not head_start and pipe.takes_early_block(drafts_left):
            draft_len = min(pipe.draft_len, drafts_left, EARLY_DRAFT_LEN)
            self.early = EarlyBlock(self.drafter, self.prompt, self.params, draft_len, drafts_left)
        else:
            self.drafter.begin(self.prompt, self.params)
        try:
            self._open(head_start)
            while not self._step():
                pass
            self.stats.wall_s = time.perf_counter() - self.started  # tearing the session down is not generation time
        except VerifierError as exc:  # the generation ends here: keep what it made
            self.stats.wall_s = time.perf_counter() - self.started
            exc.partial = GenerationResult(list(self.generated), StopReason.NONE, self.stats, self.ttft)
            raise
        finally:
            ending = sys.exc_info()[1]  # what ends the generation, if anything does
            try:
                self._finish_early_block()  # the drafter may be closed next: its thread must be done
            except Exception as exc:
                if ending is None:  # nothing else went wrong: the drafting's failure is the news
                    raise
                # Secondary to why the generation ended (a bad prompt fails the drafter and the Open alike).
                log.debug("drafting the early block failed too: %s: %s", type(exc).__name__, exc)
            finally:
                self.verifier.close()
        self.stats.target_forwards = self.verifier.forwards
        return GenerationResult(self.generated, self.stop, self.stats, self.ttft)

    def _head_start(self) -> int:
        """Empty blocks to send behind the Open: none, unless the controller starts the session with the
        cloud alone on what the connection measured of the link (``Controller.start``); then a window of
        them, within the verifier's hint of blocks in flight and the token limit."""
        pipe, hint = self.pipeline, self.verifier.link_hint
        self._expect_ahead(asked_draft_len(pipe.draft_len, pipe.window, hint, self.params.reproducible))
        plan = None if hint is None else pipe.head_start(hint.round_trip_s, hint.cloud.token_s_for(self.params.reproducible))
        if plan is None:
            return 0
        log.debug("the cloud decodes alone from the start: %s", pipe.schedule.describe(plan))
        return max(min(plan.window, hint.cloud.max_blocks_in_flight or 1, self.max_new_tokens - 1), 0)

    def _expect_ahead(self, held_limit: int) -> None:
        """Tell the schedule that the verifier decodes ahead after a correction, ``held_limit`` tokens held
        at most, where the Open asks it to (``Open.takes_ahead``: pipelined, drafting) and the mode lets it
        (greedy and coupled: the tokens are the target's whatever the drafts); else that it does not."""
        decodes = self.pipeline.window > 1 and held_limit > 0 and self.guesses_are_trials
        self.pipeline.schedule.expect_ahead(held_limit if decodes else 0)

    def _open(self, head_start: int) -> None:
        pipe, early = self.pipeline, self.early
        max_draft_len = asked_draft_len(pipe.draft_len, pipe.window, self.verifier.link_hint, self.params.reproducible)
        opening = time.perf_counter()
        terms = self.verifier.open(self.prompt, self.params, self.max_new_tokens, max_draft_len,
                                   early_block=early and early.future, head_start=head_start,
                                   pipelined=pipe.window > 1)
        self._expect_ahead(terms.max_draft_len if max_draft_len else 0)
        self._adopt(terms)
        if terms.answers_first_position:  # the first token comes right after the prefill
            self._expect_first_position()
            if early is not None and terms.kept_early_block:
                self.kept_early, self.early_guess = True, early.guess
                pipe.sent(InFlight(self.epoch, len(self.prompt) + 1, early.block, early.more_follows, early.sent_at,
                                    early.draft_s, early=True))
            for i in range(terms.head_start):
                pipe.sent(InFlight(self.epoch, len(self.prompt) + 1 + i, DraftBlock([]), False, opening, early=True))

    def _expect_first_position(self) -> None:
        self.pipeline.sent(InFlight(self.epoch, self.committed_end, DraftBlock([]), False, time.perf_counter(),
                                     first=True))

    def _adopt(self, terms: SessionTerms) -> None:
        """Fit the schedule to what the verifier allows (``Schedule.adopt``); with nothing to draft, the
        cloud decodes alone (``FixedSchedule``: empty blocks in flight unless the session is lock-step)."""
        pipe, (draft_len_cap, hedge_cap) = self.pipeline, self.caps
        pipe.draft_limit, pipe.max_empty_blocks = terms.max_draft_len, terms.max_empty_blocks
        if min(draft_len_cap, terms.max_draft_len) == 0:
            pipe.schedule = FixedSchedule(0, pipe.window, pipe.cloud_window)
        pipe.follow(pipe.schedule.adopt(terms, draft_len_cap, hedge_cap, self.branch_len))

    @property
    def branch_len(self) -> int:
        """Tokens per hedge branch: ``BRANCH_LEN``, within the session's draft limit (a branch keeps to it too)."""
        return min(BRANCH_LEN, self.pipeline.draft_limit or BRANCH_LEN)

    def _hold_to(self, draft_limit: int) -> None:
        """The verifier lowered the session's drafts per block (guesses included): every block from now on
        keeps to it (a limit only ever comes down)."""
        pipe = self.pipeline
        if pipe.draft_limit is not None and draft_limit >= pipe.draft_limit:
            return
        log.info("the verifier holds this session's blocks to %d drafts", draft_limit)
        pipe.draft_limit, pipe.draft_len = draft_limit, min(pipe.draft_len, draft_limit)
        pipe.schedule.lower_draft_limit(draft_limit, self.branch_len)

    def _finish_early_block(self) -> None:
        """Before the drafter is touched: the early block's thread is done, and forgotten unless it stands."""
        if self.early is not None:
            self.early.finish(self.kept_early)

    def _commit(self, tokens: list[int]) -> bool:
        """Commit ``tokens``; True when the caller wants the generation to stop here."""
        self.generated.extend(tokens)
        if tokens and not self.ttft:
            self.ttft = time.perf_counter() - self.started
        halt = bool(self.on_tokens and tokens) and self.on_tokens(tokens) is True
        self._finish_early_block()  # (the first token reaches the caller before the early block's drafting is waited for)
        self.drafter.commit(tokens)
        return halt

    def _step(self) -> bool:
        """Draft and send what may go, then take one verdict; True when the generation is over."""
        plan = self.pipeline.replan(drafting=self.drafting is not None,
                                    tokens_left=self.max_new_tokens - len(self.generated))
        described = self.pipeline.schedule.describe(plan) if plan and log.isEnabledFor(logging.DEBUG) else ""
        if described:  # (a fixed schedule has nothing to say)
            log.debug("at %d tokens: %s", len(self.generated), described)
        self._draft_and_send()
        if self.drafting is None and not self.verifier.ready():  # nothing more may go: the drafter is idle
            self._bet(idle=True)
        try:
            received = self.verifier.receive()
        except LinkLost as lost:
            return self._resume(lost)
        return self._take(received)

    def _draft_and_send(self) -> None:
        pipe, drafter, verifier = self.pipeline, self.drafter, self.verifier
        while self.drafting is not None or pipe.may_send():
            if self.drafting is None:
                nxt = pipe.next_block(self.committed_end, len(self.prompt) + self.max_new_tokens)
                if nxt is None:
                    break
                self._finish_early_block()
                if nxt.drafts and self._bet(idle=False) and verifier.ready():
                    break  # (a verdict arrived while the branch was drafted: it is read first)
                self.drafting = Drafting(nxt.start_position, nxt.drafts, nxt.drafts_left, empty_blocks=nxt.empty_blocks)
                if nxt.drafts and not pipe.live():  # a chain's first block: a speculation cache's branch may begin it
                    self.drafting = self.cache.seed(self.drafting, self.prompt + self.generated, drafter, self.stats)
            drafting = self.drafting
            if len(drafting.block.tokens) < drafting.drafts:
                # A verdict that arrives meanwhile is read first: it may void this block.
                began = time.perf_counter()
                more = drafter.draft(drafting.drafts - len(drafting.block.tokens), stop=verifier.ready)
                self.drafting = drafting = drafting.grown(more, time.perf_counter() - began)
                if len(drafting.block.tokens) < drafting.drafts and verifier.ready():
                    break
            block, drafted_at = drafting.block, time.perf_counter()
            width = pipe.schedule.hedge_width
            if width:
                block = hedge(drafter, block, width, self.branch_len,
                              committed=max(self.committed_end - drafting.start, 0))
            sent_at = time.perf_counter()
            follows = more_follows(len(block.tokens), drafting.drafts_left, pipe.window)
            if drafting.empty_blocks > 1:  # the cloud alone: one frame for several empty blocks
                verifier.send(self.epoch, drafting.start, block, follows, empty_blocks=drafting.empty_blocks)
            else:
                verifier.send(self.epoch, drafting.start, block, follows)
            log.debug("%.3f s: sent block @%d: %s", sent_at - self.started, drafting.start,
                      f"{len(block.tokens)} drafts, drafted in {drafting.draft_s * 1e3:.0f} ms" if block.tokens
                      else f"{drafting.empty_blocks} empty")
            if self.cache.restarting:
                self.stats.record_restart(drafting.draft_s - drafting.cached_s)
                self.cache.restarting = False
            pipe.sent(InFlight(self.epoch, drafting.start, block, follows, sent_at, drafting.draft_s,
                                sent_at - drafted_at))
            for i in range(1, drafting.empty_blocks):
                pipe.sent(InFlight(self.epoch, drafting.start + i, DraftBlock([]), False, sent_at))
            self.drafting = None

    def _bet(self, idle: bool) -> bool:
        """Draft a speculation cache's branch for the oldest live block in flight, where the cache is on and
        bets on it: when the drafter is ``idle`` (nothing more may go), or else before the chain's next
        block where the branch is likelier to be used (``SpeculationCache.pays``). True when one was drafted."""
        pipe = self.pipeline
        live = pipe.live()
        bet = self.cache.bet(live, self.committed_end) if pipe.draft_len else None
        if bet is None:
            return False
        self._finish_early_block()  # (only now: the first token is not held up for an early block's thread)
        drafts = pipe.draft_len + len(pipe.in_flight) - 1  # a chain's first block guesses each void block's token
        return self.cache.draft(self.drafter, bet, live, min(drafts, pipe.draft_limit or drafts), idle=idle,
                                stop=self.verifier.ready, stats=self.stats)

    def _resume(self, lost: LinkLost) -> bool:
        """Adopt the verifier's state after a broken stream; True when the generation is over."""
        log.warning("link to the verifier lost after %d tokens (%s); resuming", len(self.generated), lost)
        resumed = self.verifier.resume(self.prompt + self.generated)
        self._finish_early_block()
        self.drafter.rewind()  # what was in flight is drafted again, from the verifier's state
        self.pipeline.clear()
        self.drafting, self.early_guess = None, None
        halt = self._commit(resumed.missed)
        self.stats.record_recovered(len(resumed.missed))
        if halt or resumed.stop_reason is not StopReason.NONE:
            self.stop = StopReason.STOP if halt else resumed.stop_reason
            return True
        self.epoch = resumed.epoch
        self._adopt(resumed.terms)
        if resumed.terms.answers_first_position:
            self._expect_first_position()
        return False

    def _take(self, received: Received) -> bool:
        """Check and commit the verdict for the oldest block in flight (none if unasked); True when it is all over."""
        pipe, prompt_len, verdict = self.pipeline, len(self.prompt), received.verdict
        committed_end = self.committed_end
        sent = pipe.answered() if not verdict.unasked else InFlight(  # (the final verdict, answering no block)
            self.epoch, committed_end, DraftBlock([]), False, time.perf_counter(), early=True)
        skip = verdict.start_position - sent.start_position  # drafts the verifier's own tokens already held
        drafts = sent.block.tokens[skip:] if skip >= 0 else []
        branches = tuple((at - skip, tokens) for at, tokens in sent.block.branches if at >= skip)
        check_answers(verdict, sent, skip, drafts, branches, self.generated, prompt_len)
        committed = verdict.committed(drafts, branches)
        if len(self.generated) + len(committed) > self.max_new_tokens:  # (checked before anything is taken)
            raise ProtocolError(f"verdict commits {len(committed)} tokens with {len(self.generated)} of "
                                f"{self.max_new_tokens} already committed: past the token limit")
        self.stats.ahead += verdict.ahead
        if verdict.stale:
            self._record_stale(sent, received, committed_end, committed)
        else:
            self._record_live(sent, verdict, skip, drafts, branches, committed)
        arrived = time.perf_counter()
        if not sent.first and not verdict.stale:
            # In a stretch the cloud decodes alone, the interval between its tokens is its real rate.
            interval = arrived - self.last_arrival if not drafts and pipe.since_plan > 0 else None
            self._observe(sent, len(drafts), max(skip, 0), received, committed, interval)
        self.last_arrival = arrived
        if sent.first and self.early_guess is not None:
            # The early block rests on a wrong guess: it is verified all the same, but nothing is chained on it.
            pipe.hold_if(committed[:1] != [self.early_guess])
            self.early_guess = None
        if verdict.draft_limit:
            self._hold_to(verdict.draft_limit)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%.3f s: %s", arrived - self.started, describe_verdict(sent, verdict, len(drafts), committed,
                                                                             len(self.generated), len(pipe)))
        halt = self._commit(committed)
        chain_broken = bool(verdict.stale and committed) and not first_live_continues(pipe, self.generated,
                                                                                         prompt_len)
        voids = pipe.settle(sent, len(committed), correction=verdict.is_correction, stale=verdict.stale,
                            chain_broken=chain_broken)
        if verdict.done or halt:
            self.stop = verdict.stop_reason if verdict.done else StopReason.STOP
            return True
        self.epoch = next_epoch(self.epoch, verdict)
        if verdict.is_correction and not verdict.stale and drafts:  # (not the cloud decoding alone)
            self.cache.restarting = True
        if voids or (self.drafting is not None and not self.drafting.continues(self.generated, prompt_len)):
            # The next chain is drafted from the committed tokens (a block being drafted went past them, or
            # was a chain's first block that guessed a token decoded for a void block wrong).
            self.drafter.rewind()
            self.drafting = None
        if len(self.generated) >= self.max_new_tokens:
            raise ProtocolError(f"verifier did not stop at the token limit of {self.max_new_tokens}")
        return False

    def _record_stale(self, sent: InFlight, received: Received, committed_end: int, committed: list[int]) -> None:
        verdict, trials = received.verdict, None
        ahead = min(verdict.ahead, len(verdict.rebased))  # (decoded before the block came: not its forward's)
        self.stats.record_stale(len(committed), len(verdict.rebased) - ahead, verdict.rebased_verified - ahead,
                                verdict.ahead)
        guessed = guesses_of(self.pipeline, self.drafting, committed_end, committed)
        if guessed is not None:
            first_draft, guesses = guessed
            right = common_prefix_length(guesses, committed)
            if right < len(guesses) or len(guesses) == len(committed):  # (else right so far, not done)
                self.stats.record_stale_decode_guess(right == len(committed))
            if self.guesses_are_trials:  # the drafts a live block held there
                trials = (first_draft, len(guesses), right)
        observe_stale_verdict(self.pipeline.schedule, StaleVerdict(
            len(committed) - verdict.ahead, len(verdict.rebased) - ahead, None if sent.early else time.perf_counter() - sent.sent_at,
            received.timing, len(sent.block.tokens), sent.draft_s, guess_trials=trials))

    def _record_live(self, sent: InFlight, verdict: Verdict, skip: int, drafts: list[int],
                     branches: tuple[tuple[int, list[int]], ...], committed: list[int]) -> None:
        guesses = sent.block.runner_up[skip:] if sent.block.runner_up else None
        if verdict.is_correction and guesses and guesses[verdict.accepted] is not None:
            self.stats.record_correction_guess(committed[verdict.accepted] == guesses[verdict.accepted])
        if branches:
            self.stats.record_hedges(len(branches), verdict.branch > 0, branch_gain(verdict, committed))
        if not sent.block.tokens and verdict.rebased_verified > verdict.ahead:  # the cloud alone, its proposals on the way
            ahead = min(verdict.ahead, len(verdict.rebased))  # (decoded before the block came: not proposals)
            self.stats.record_proposals(verdict.rebased_verified - ahead, len(verdict.rebased) - ahead)
        # Drafts that matched tokens decoded ahead were not verified by this block's forward: not its step's.
        matched = verdict.ahead if drafts else 0
        self.stats.record_round(len(drafts) - matched, verdict.accepted - matched, len(committed),
                                chain_continues=verdict.is_deferred)

    def _observe(self, sent: InFlight, drafted: int, skipped: int, received: Received, committed: list[int],
                 interval_s: float | None) -> None:
        """Feed one verdict's measurements to the schedule (before the drafter commits it); ``drafted``:
        the block's drafts the verifier verified, after the ``skipped`` it held that were committed already."""
        schedule, verdict = self.pipeline.schedule, received.verdict
        draft_s = sent.draft_s * drafted / len(sent.block.tokens) if drafted else 0.0
        cloud_token = observe_verdict(schedule, LiveVerdict(
            drafted, sent.size, verdict.accepted, time.perf_counter() - sent.sent_at, draft_s, received.timing,
            tokens=len(committed) - verdict.ahead, interval_s=interval_s, early=sent.early, wrong_guess=self.pipeline.hold,
            hedged=bool(sent.block.branches), gained=branch_gain(verdict, committed), hedge_s=sent.hedge_s,
            skipped=skipped))
        if cloud_token and committed and self.pipeline.shadow_due():
            started = time.perf_counter()
            shadow = self.drafter.draft(1).tokens  # what the drafter would have proposed for this position
            schedule.observe_shadow(shadow == committed[:1], time.perf_counter() - started)


