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
(``sim.inprocess``) or over gRPC (``edge.client``). The loop trusts only
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
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Protocol

from edge.controller import REPLAN_TOKENS, SHADOW_EVERY, Controller
from edge.drafter import DraftBlock, Drafter, common_prefix_length
from edge.early_block import EARLY_DRAFT_LEN, EarlyBlock
from edge.hedging import hedge
from shared.params import Mode, SamplingParams
from shared.stats import DecodeStats
from shared.verdict import StopReason, Verdict
from shared.wire import committed_skip, next_epoch

__all__ = [
    "VerifierConnection",
    "SessionTerms",
    "Resumption",
    "GenerationResult",
    "run_decode",
    "ProtocolError",
    "VerifierError",
    "LinkLost",
]

log = logging.getLogger(__name__)


class ProtocolError(RuntimeError):
    """The verifier answered something that does not fit the blocks we sent."""


class VerifierError(RuntimeError):
    """The cloud could not be reached, refused us, or went away for good.

    ``bad_input``: the cloud refused what we asked for (a status that says the
    request was wrong), so a command line exits 2, not 1. ``partial``: what
    ``run_decode`` had generated when it failed (set by ``run_decode``).
    """

    def __init__(self, message: str, bad_input: bool = False) -> None:
        super().__init__(message)
        self.bad_input = bad_input
        self.partial: GenerationResult | None = None


class LinkLost(VerifierError):
    """The stream to the verifier broke or went silent; the session may be resumed."""


@dataclass(frozen=True)
class SessionTerms:
    """What the verifier allows a session (its ``Opened``)."""

    max_draft_len: int  # drafts per block (the loop asks for window - 1 more: guesses for stale blocks' tokens)
    max_blocks_in_flight: int  # blocks sent and not yet answered
    answers_first_position: bool = False  # a verdict for the first position comes unasked (an empty block)
    max_branches: int = 0  # hedge branches a block may carry
    kept_early_block: bool = False  # the block drafted while the Open was in flight went out and fits these terms


@dataclass(frozen=True)
class Resumption:
    """The verifier's state after a broken stream, which the edge adopts (``VerifierConnection.resume``)."""

    terms: SessionTerms
    epoch: int  # the session's epoch: blocks go out at it
    missed: list[int]  # tokens the verifier committed past the edge's (verdicts lost in the cut)
    stop_reason: StopReason = StopReason.NONE  # not NONE: the session had ended; ``missed`` holds its last tokens
    reopened: bool = False  # the session was gone: a new one was opened on the committed tokens


class VerifierConnection(Protocol):
    """One generation session with a verifier, wherever it runs.

    Every block sent gets exactly one verdict, in order; one drafted at an
    epoch older than the session's, or that does not continue the committed
    tokens, gets a stale one (``Verdict.stale``).
    """

    forwards: int  # target forwards the verifier reports for this session, prefill included
    last_cloud_s: float  # the cloud's own time for the last verdict received (its server_us)
    last_forward_s: float  # ... of that, the forward that answered it (its forward_us; 0: none, or not said)

    def open(self, prompt: Sequence[int], params: SamplingParams, max_new_tokens: int, max_draft_len: int,
             early_block: Future | None = None) -> SessionTerms:
        """Start a session for ``prompt``; returns what the verifier allows.

        ``early_block``: resolves (on another thread) to a (block, more_follows) for the position
        after the first, which the verifier answers unasked; it is sent if it is ready before the
        Opened arrives, and ``kept_early_block`` says whether it went and stands (it fits the
        session's draft length: the verifier drops one that does not)."""

    def send(self, epoch: int, start_position: int, block: DraftBlock, more_follows: bool) -> None:
        """Queue one block for verification (returns at once)."""

    def receive(self) -> Verdict:
        """The next verdict (blocks until it arrives); ``LinkLost`` when the stream broke."""

    def ready(self) -> bool:
        """Whether ``receive`` would return (or raise) without waiting: a verdict, or the news that
        the stream broke, has arrived."""

    def resume(self, committed: Sequence[int]) -> Resumption:
        """After ``LinkLost``: the same session on a new stream, or, when it is gone, a new one opened
        on ``committed`` (prompt included). Blocks sent before are forgotten. Raises
        ``VerifierError`` when the verifier stays out of reach."""

    def close(self) -> None:
        """End the session."""


@dataclass
class GenerationResult:
    tokens: list[int]  # generated ids, prompt excluded
    stop_reason: StopReason
    stats: DecodeStats = field(default_factory=DecodeStats)
    ttft_s: float = 0.0  # time from start to the first committed token


@dataclass(frozen=True)
class _Drafting:
    """A block being drafted. Drafting stops when a verdict arrives, so that one that voids the
    block ends it at once; otherwise drafting goes on after the verdict is read."""

    start: int  # the position of its first draft
    drafts: int  # the drafts it is to hold
    room: int  # tokens the limit leaves from ``start``, the correction or bonus aside
    block: DraftBlock = field(default_factory=lambda: DraftBlock([]))  # drafted so far
    draft_s: float = 0.0  # ... in this many seconds

    def grown(self, more: DraftBlock, seconds: float) -> _Drafting:
        return replace(self, block=self.block.then(more), draft_s=self.draft_s + seconds)

    def continues(self, generated: list[int], prompt_len: int) -> bool:
        """Whether the tokens committed from ``start`` on (``generated`` from ``prompt_len``) are
        drafts of this block (a chain's first block guessed them), or there are none."""
        committed = generated[self.start - prompt_len:]
        return committed == self.block.tokens[:len(committed)]


@dataclass(frozen=True)
class _InFlight:
    epoch: int
    start_position: int
    block: DraftBlock
    more_follows: bool
    sent_at: float = 0.0  # perf_counter at send
    draft_s: float = 0.0  # drafting time of this block's drafts
    hedge_s: float = 0.0  # ... and of its hedge branches
    first: bool = False  # the first position, answered with the Open (not a measurement)
    early: bool = False  # sent before the Opened: its trip spans the prefill (only its acceptance is a measurement)
    void: bool = False  # drafted past a token the verifier did not commit: likely answered stale (any verdict is taken)

    @property
    def end(self) -> int:
        """The position after the last one this block asks about (an empty block asks for one token)."""
        return self.start_position + max(len(self.block.tokens), 1)


def run_decode(
    drafter: Drafter,
    verifier: VerifierConnection,
    prompt: Sequence[int],
    params: SamplingParams,
    *,
    max_new_tokens: int,
    draft_len: int,
    window: int = 1,
    controller: Controller | None = None,
    hedge_width: int = 0,
    on_tokens: Callable[[list[int]], bool | None] | None = None,
) -> GenerationResult:
    """Generate up to ``max_new_tokens`` tokens; ``draft_len`` 0 is target-only decoding.

    ``window``: blocks in flight at most (1 = lock-step; the verifier may
    allow fewer). With a ``controller`` (the adaptive schedule), each chain's
    draft length and window come from it, ``draft_len`` and ``window`` being
    the caps, and a draft length of 0 has the cloud decode alone: empty blocks, a window of them in
    flight, with the drafter's would-be proposals measured in the shadow.
    ``hedge_width``: hedge branches per block (``edge.hedging``; greedy and coupled
    modes, as many as the verifier allows).
    ``on_tokens`` sees each verdict's committed tokens as soon as they are final;
    when it returns True the generation stops there (``StopReason.STOP``).
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
    stop = StopReason.NONE
    cap = draft_len  # the caller's draft length; a resumed session may allow a different one
    draft_limit = draft_len  # the verifier's limit on a block's drafts (guesses for void blocks' tokens included)
    branches_cap = hedge_width  # (rejection mode's blocks carry q̃, and ``hedge`` leaves them alone)

    def commit(tokens: list[int]) -> bool:
        """Commit ``tokens``; True when the caller wants the generation to stop here."""
        nonlocal ttft
        generated.extend(tokens)
        if tokens and not ttft:
            ttft = time.perf_counter() - started
        halt = bool(on_tokens and tokens) and on_tokens(tokens) is True
        settle()  # (the first token reaches the caller before the early block's drafting is waited for)
        drafter.commit(tokens)
        return halt

    def adopt(terms: SessionTerms) -> None:
        """Fit the schedule to what the verifier allows."""
        nonlocal draft_len, draft_limit, window, controller, hedge_width
        draft_len, draft_limit = min(cap, terms.max_draft_len), terms.max_draft_len
        hedge_width = min(branches_cap, terms.max_branches)
        window = min(window, terms.max_blocks_in_flight) if draft_len else 1
        if controller is not None and draft_len:
            controller.cap(draft_len)
            controller.hedge_cap = hedge_width  # whether to hedge is its choice
            controller.window = min(controller.window, terms.max_blocks_in_flight)
            controller.cloud_window = min(controller.cloud_window, terms.max_blocks_in_flight)
            window = controller.drafting_window  # its choice (two until it has measured): the first chain too
        else:
            controller = None

    # While the prefill runs, the first block is drafted on a thread (lock-step keeps one block at a
    # time: none); the connection sends it if it is ready before the Opened (``edge.early_block``).
    room = max_new_tokens - 2  # the first token, then the block's correction or bonus
    early = None
    if draft_len > 0 and window >= 2 and room >= 1:
        early = EarlyBlock(drafter, prompt, params, min(draft_len, room, EARLY_DRAFT_LEN), room)
    else:
        drafter.begin(prompt, params)
    kept_early = False
    # A chain's first block's drafts at tokens decoded for stale blocks are acceptance trials where a
    # draft is accepted exactly when it is the target's token (rejection mode accepts by odds).
    guesses_are_trials = params.is_greedy or params.mode is not Mode.REJECTION
    hold = False  # blocks in flight were drafted past a token the verifier did not commit: send none until they drain
    early_guess = None  # the first token the kept early block was drafted on, until the first verdict

    def may_send() -> bool:
        """Whether another block may go now."""
        if len(in_flight) >= window or leaving_cloud or hold:
            return False
        if in_flight and in_flight[0].first:  # the first token is in hand: it reaches the caller first
            return False
        return _may_follow(in_flight, draft_len)

    def settle() -> None:
        """Before the drafter is touched: the early block's thread is done, and forgotten unless it stands."""
        if early is not None:
            early.settle(kept_early)

    try:
        # A block after a correction carries a guess for each void block in flight: room for window - 1 more.
        terms = verifier.open(prompt, params, max_new_tokens, draft_len + window - 1 if draft_len else 0,
                              early_block=early and early.future)
        adopt(terms)
        if terms.answers_first_position:  # the first token comes right after the prefill
            in_flight.append(_InFlight(epoch, len(prompt), DraftBlock([]), False, time.perf_counter(), 0.0, first=True))
            if early is not None and terms.kept_early_block:
                kept_early, early_guess = True, early.guess
                in_flight.append(_InFlight(epoch, len(prompt) + 1, early.block, early.more_follows, early.sent_at,
                                           early.draft_s, early=True))
        since_plan = 0  # tokens committed since the controller last chose
        leaving_cloud = False  # a switch from cloud decoding to drafting waits for the pipeline to drain
        drafting: _Drafting | None = None  # the block being drafted, when drafting stopped to read a verdict
        last_arrival = time.perf_counter()
        while True:
            if controller is not None and drafting is None and all(f.void for f in in_flight):  # a new chain starts
                plan = controller.plan()
                draft_len, window, since_plan, leaving_cloud = plan.draft_len, plan.window, 0, False
                log.debug("at %d tokens: %s", len(generated), controller.describe(plan))
            elif controller is not None and draft_len == 0 and since_plan >= REPLAN_TOKENS:
                # While the cloud decodes alone, choose again every few tokens without draining the
                # pipeline; only a switch to drafting waits for the empty blocks still in flight.
                since_plan = 0
                leaving_cloud = controller.plan().draft_len > 0
            elif controller is not None and draft_len > 0 and since_plan >= REPLAN_TOKENS:
                # A long chain (a drafter that is seldom wrong) chooses its draft length and window again on the way.
                since_plan = 0
                plan = controller.plan(drafting_only=True)
                draft_len, window = plan.draft_len, plan.window
            while drafting is not None or may_send():
                if drafting is None:
                    committed_end = len(prompt) + len(generated)
                    live = [f for f in in_flight if not f.void]
                    # A new chain starts at the committed prefix; its first drafts guess the tokens the
                    # void blocks in flight will bring (one each, as the token decoded for each; the rebased
                    # drafts before it, which are often none, are not counted: the session allows
                    # window - 1 drafts more than draft_len for these guesses).
                    start = live[-1].end if live else committed_end
                    guesses = 0 if live else len(in_flight)
                    produced = start - len(prompt)
                    if produced >= max_new_tokens:
                        break
                    room = max_new_tokens - produced - 1  # room for the correction/bonus inside the limit
                    n = min(draft_len + guesses if draft_len else 0, room, draft_limit)
                    if n <= 0 and live and live[-1].block.tokens:
                        break  # the limit is reached by what is in flight; wait for it
                    settle()
                    drafting = _Drafting(start, n, room)
                if len(drafting.block.tokens) < drafting.drafts:
                    # A verdict that arrives meanwhile is read first: it may void this block.
                    began = time.perf_counter()
                    more = drafter.draft(drafting.drafts - len(drafting.block.tokens), stop=verifier.ready)
                    drafting = drafting.grown(more, time.perf_counter() - began)
                    if len(drafting.block.tokens) < drafting.drafts and verifier.ready():
                        break
                block = drafting.block
                drafted_at = time.perf_counter()
                width = controller.hedge_width if controller is not None else hedge_width
                if width:
                    block = hedge(drafter, block, width)
                sent_at = time.perf_counter()
                more = window > 1 and 0 < len(block.tokens) < drafting.room
                verifier.send(epoch, drafting.start, block, more)
                in_flight.append(_InFlight(epoch, drafting.start, block, more, sent_at, drafting.draft_s,
                                           sent_at - drafted_at))
                drafting = None
            try:
                verdict = verifier.receive()
            except LinkLost as lost:
                log.warning("link to the verifier lost after %d tokens (%s); resuming", len(generated), lost)
                resumed = verifier.resume(prompt + generated)
                settle()
                drafter.rewind()  # what was in flight is drafted again, from the verifier's state
                in_flight.clear()
                drafting = None
                hold, early_guess = False, None
                halt = commit(resumed.missed)
                stats.record_recovered(len(resumed.missed))
                if halt or resumed.stop_reason is not StopReason.NONE:
                    stop = StopReason.STOP if halt else resumed.stop_reason
                    break
                epoch = resumed.epoch
                adopt(resumed.terms)
                if resumed.terms.answers_first_position:
                    in_flight.append(_InFlight(epoch, len(prompt) + len(generated), DraftBlock([]), False,
                                               time.perf_counter(), 0.0, first=True))
                continue
            sent = in_flight.popleft()
            committed_end = len(prompt) + len(generated)
            skip = verdict.start_position - sent.start_position  # drafts the verifier's own tokens already held
            drafts = sent.block.tokens[skip:] if skip >= 0 else []
            branches = tuple((at - skip, tokens) for at, tokens in sent.block.branches if at >= skip)
            if (
                verdict.epoch != sent.epoch
                or verdict.start_position != committed_end
                or (not verdict.stale and sent.block.tokens and not _skips(sent, skip, generated[sent.start_position
                                                                                                 - len(prompt):]))
                or (verdict.stale and (verdict.accepted or verdict.branch))
                or (verdict.rebased and not verdict.stale)
                or verdict.accepted > len(drafts)
                or (verdict.is_deferred and not sent.more_follows)
                or not _answers_branch(verdict, branches)
            ):
                raise ProtocolError(
                    f"verdict for epoch {verdict.epoch} position {verdict.start_position} ({verdict.accepted} accepted) "
                    f"does not answer the block sent at epoch {sent.epoch} position {sent.start_position} "
                    f"with {len(generated)} tokens committed"
                )
            committed = verdict.committed(drafts, branches)
            void_now = verdict.is_correction  # everything in flight was drafted past the corrected token
            if verdict.stale:
                stats.record_stale(len(committed), len(verdict.rebased), verdict.rebased_verified)
                guessed = _guesses(in_flight, drafting, committed_end, committed)
                if guessed is not None:
                    first_draft, guesses = guessed
                    right = common_prefix_length(guesses, committed)
                    if right < len(guesses) or len(guesses) == len(committed):  # (else right so far, not done)
                        stats.record_fill_guess(right == len(committed))
                    if controller is not None and guesses_are_trials:  # the drafts a live block held there
                        controller.observe_acceptance(len(guesses), right, first=first_draft)
                if controller is not None:
                    controller.observe_stale(len(committed), len(verdict.rebased), verifier.last_forward_s,
                                             trip_s=None if sent.early else time.perf_counter() - sent.sent_at,
                                             cloud_s=verifier.last_cloud_s,
                                             drafted=len(sent.block.tokens), draft_s=sent.draft_s)
                # A block the loop thought usable was stale, or the tokens decoded for it leave the live
                # blocks in flight unusable (decided once they are committed, below): all in flight is void.
                void_now = not sent.void
            else:
                guesses = sent.block.runner_up[skip:] if sent.block.runner_up else None
                if verdict.is_correction and guesses and guesses[verdict.accepted] is not None:
                    stats.record_correction_guess(committed[verdict.accepted] == guesses[verdict.accepted])
                if branches:
                    stats.record_hedges(len(branches), verdict.branch > 0, _branch_gain(verdict, committed))
                stats.record_round(len(drafts), verdict.accepted, len(committed))
            arrived = time.perf_counter()
            if controller is not None and not sent.first and not verdict.stale:
                # In a stretch the cloud decodes alone, the interval between its tokens is its real rate.
                interval = arrived - last_arrival if not drafts and since_plan > 0 else None
                _observe(controller, drafter, sent, len(drafts), verdict, committed, verifier, since_plan, interval, hold)
            last_arrival = arrived
            if sent.first and early_guess is not None:
                hold = committed[:1] != [early_guess] and bool(in_flight)  # the early block rests on a wrong guess:
                early_guess = None  # it is verified all the same, but nothing is chained on it
            halt = commit(committed)
            if verdict.stale and committed and not void_now:
                void_now = not _first_live_continues(in_flight, generated, len(prompt))
            since_plan += len(committed)
            if verdict.done or halt:
                stop = verdict.stop_reason if verdict.done else StopReason.STOP
                break
            epoch = next_epoch(epoch, verdict)
            if void_now:
                in_flight = _voided(in_flight)
                drafter.rewind()  # the next chain is drafted from the committed tokens
                drafting = None  # (drafted past them)
            elif drafting is not None and not drafting.continues(generated, len(prompt)):
                drafting = None  # a chain's first block that guessed a token decoded for a void block wrong
                drafter.rewind()
            if not in_flight:
                hold = False
            if len(generated) >= max_new_tokens:
                raise ProtocolError(f"verifier did not stop at the token limit of {max_new_tokens}")
        stats.wall_s = time.perf_counter() - started  # tearing the session down is not generation time
    except VerifierError as exc:  # the generation ends here: keep what it made
        stats.wall_s = time.perf_counter() - started
        exc.partial = GenerationResult(list(generated), StopReason.NONE, stats, ttft)
        raise
    finally:
        try:
            settle()  # the drafter may be closed next: its thread must be done
        except Exception:  # noqa: BLE001 - what drafting raised is secondary to why the generation ended
            log.exception("drafting the early block failed")
        verifier.close()
    stats.target_forwards = verifier.forwards
    return GenerationResult(generated, stop, stats, ttft)


def _branch_gain(verdict: Verdict, committed: list[int]) -> int:
    """Tokens a taken hedge branch committed past the correction (0: none taken)."""
    return len(committed) - verdict.accepted - 1 if verdict.branch else 0


def _answers_branch(verdict: Verdict, branches: tuple[tuple[int, list[int]], ...]) -> bool:
    """Whether a verdict's branch fields fit the block's ``branches`` (indexed from the verdict's
    start): a branch it had, hung on the draft the verdict rejected, no more of it accepted than it held."""
    if not verdict.branch:
        return verdict.branch_accepted == 0
    if verdict.branch > len(branches):
        return False
    at, tokens = branches[verdict.branch - 1]
    return at == verdict.accepted and verdict.branch_accepted < len(tokens)


def _may_follow(in_flight: deque[_InFlight], draft_len: int) -> bool:
    """Whether another block may go now: after a block with more_follows, after empty blocks
    when this one is empty too (each asks for one token; none can be corrected), or as a new
    chain when everything in flight is void."""
    if not in_flight:
        return True
    last = in_flight[-1]
    return last.void or last.more_follows or (not last.block.tokens and draft_len == 0)


def _skips(sent: _InFlight, skip: int, committed_since: list[int]) -> bool:
    """Whether a verifier may skip the first ``skip`` drafts of ``sent``: the tokens committed
    since its start position are exactly those drafts."""
    return 0 <= skip <= len(sent.block.tokens) and sent.block.tokens[:skip] == committed_since


def _guesses(in_flight: deque[_InFlight], drafting: _Drafting | None, position: int,
             tokens: list[int]) -> tuple[int, list[int]] | None:
    """What a chain's first block (the first live one in flight, else the one being drafted) guessed of
    ``tokens``, decoded for a stale block from ``position`` on: (its draft index at ``position``, its
    drafts there, as many as it has of ``tokens``' length). None: there is no such block, or it has
    drafted none there. Those drafts are still its own (it is live): each is a trial of its index, as
    a verdict's would be."""
    live = next((f for f in in_flight if not f.void and f.block.tokens), None)
    if live is not None:
        start, drafts = live.start_position, live.block.tokens
    elif drafting is not None:
        start, drafts = drafting.start, drafting.block.tokens
    else:
        return None
    guesses = drafts[position - start:][:len(tokens)] if position >= start else []
    return (position - start, guesses) if guesses else None


def _voided(in_flight: deque[_InFlight]) -> deque[_InFlight]:
    """Every block in flight marked void (the verifier will most likely answer each as stale)."""
    return deque(replace(f, void=True) for f in in_flight)


def _first_live_continues(in_flight: deque[_InFlight], generated: list[int], prompt_len: int) -> bool:
    """Whether the first live block in flight with drafts still continues the committed tokens
    (``generated``, from position ``prompt_len``) as the verifier checks it (``committed_skip``).
    True when there is none."""
    live = next((f for f in in_flight if not f.void and f.block.tokens), None)
    return live is None or committed_skip(live.start_position, live.block.tokens, generated, prompt_len) is not None


def _observe(controller: Controller, drafter: Drafter, sent: _InFlight, drafted: int, verdict: Verdict,
             committed: list[int], verifier: VerifierConnection, since_plan: int, interval_s: float | None,
             wrong_guess: bool) -> None:
    """Feed one verdict's measurements to the controller (before the drafter commits it); ``drafted``:
    the block's drafts the verifier verified."""
    cloud_s, forward_s = verifier.last_cloud_s, verifier.last_forward_s
    trip = time.perf_counter() - sent.sent_at
    if sent.early:
        if not wrong_guess:  # (drafted after a first token the target did not pick: measures nothing)
            controller.observe_acceptance(drafted, verdict.accepted)
        return
    if drafted:
        hedged = bool(sent.block.branches)
        controller.observe_block(drafted, verdict.accepted, trip, sent.draft_s * drafted / len(sent.block.tokens),
                                 cloud_s, 0.0 if hedged else forward_s)
        if hedged:
            controller.observe_hedge(_branch_gain(verdict, committed), sent.hedge_s, forward_s)
        return
    if sent.block.tokens:
        return  # every draft was already committed: nothing measured
    controller.observe_cloud_token(trip, cloud_s, interval_s, forward_s)
    if committed and (controller.shadows_every_token() or since_plan % SHADOW_EVERY == 0):
        started = time.perf_counter()
        shadow = drafter.draft(1).tokens  # what the drafter would have proposed for this position
        controller.observe_shadow(shadow == committed[:1], time.perf_counter() - started)
