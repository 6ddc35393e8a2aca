"""The edge's side of the pipelining protocol, as pure state: no I/O, no clock, no drafter.

One session's chain of blocks in flight (``docs/pipelining.md``; the words are
defined in ``docs/glossary.md``). ``Pipeline`` says

- whether another block may go now (the window has room, the last block in
  flight asks for a follower or is void, no hold, no switch out of a cloud
  stretch pending, the first position answered first; a stretch's empty
  blocks go a frame of several at a time, ``stretch_top_up``);
- where the next block starts and how many drafts it holds: a new chain starts
  at the committed end, its first drafts guessing the tokens that the void
  blocks in flight will bring (one each); a block that continues a live chain
  starts where the last live block ends; the token limit leaves room for the
  correction or bonus;
- what a verdict voids: a correction, a stale verdict for a block the edge
  counted on, or a token decoded for a stale block that the live chain's first
  block guessed wrong void every block in flight;
- where the schedule chooses again (a new chain, every ``REPLAN_TOKENS``
  tokens of a chain or of a cloud stretch) and when a shadow proposal is due;
- what each verdict measures for the schedule (``observe_verdict``,
  ``observe_stale_verdict``), how a session starts (``head_start``,
  ``takes_early_block``) and the hold after a wrong guess of the first token.

It is driven by ``edge.decode_loop`` (a real verifier, real drafts) and by the
performance model's ``sim.perf.block_sim`` (a simulated clock and costs), so a
protocol rule is written here once. Positions are absolute for the decode loop
and count from the first generated token in the model; only differences matter.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from edge.controller import REPLAN_TOKENS, Plan
from edge.link_windows import CLOUD_WINDOW, cloud_window_for, stretch_top_up
from edge.schedule import Schedule
from edge.verifier_protocol import CloudTiming

__all__ = ["Flight", "NextBlock", "Pipeline", "LiveVerdict", "StaleVerdict", "observe_verdict", "observe_stale_verdict",
           "may_follow", "more_follows", "first_live", "stretch_top_up"]


class Flight(Protocol):
    """What the pipeline reads of a block in flight (the caller's record carries the rest)."""

    start_position: int  # the position of its first draft
    size: int  # tokens it holds (a chain's first block's guesses included); 0: empty, it asks for one token
    more_follows: bool  # it was sent asking the verifier for no bonus: a follower continues it
    void: bool  # drafted past a token the verifier will not commit: it will most likely be answered stale
    first: bool  # the first position, answered with the Opened (its token reaches the caller before any block)


F = TypeVar("F", bound=Flight)


def flight_end(flight: Flight) -> int:
    """The position after the last one ``flight`` asks about (an empty block asks for one token)."""
    return flight.start_position + max(flight.size, 1)


def may_follow(in_flight: deque[Flight], draft_len: int) -> bool:
    """Whether a block may follow what is in flight: after a block with ``more_follows``, after an
    empty block when this one is empty too (each asks for one token; none can be corrected), or as a
    new chain when the last block in flight is void."""
    if not in_flight:
        return True
    last = in_flight[-1]
    return last.void or last.more_follows or (last.size == 0 and draft_len == 0)


@dataclass(frozen=True)
class NextBlock:
    """Where the next block starts and what it holds."""

    start_position: int  # the position of its first draft
    drafts: int  # drafts to draft, its guesses included
    guesses: int  # ... of them, guesses of the tokens the void blocks in flight bring (a new chain's first block)
    drafts_left: int  # tokens the limit leaves from ``start_position``, the correction or bonus aside
    empty_blocks: int = 1  # an empty block: how many go in its frame, at consecutive positions (``Draft.empty_blocks``)


def more_follows(drafted: int, drafts_left: int, window: int) -> bool:
    """Whether a block of ``drafted`` drafts asks for a follower (no bonus): pipelined, not empty, and
    short of the ``drafts_left`` the limit leaves (``NextBlock.drafts_left``)."""
    return window > 1 and 0 < drafted < drafts_left


def first_live(in_flight: Iterable[F]) -> F | None:
    """The first live block in flight with drafts (a new chain's first block, when one was sent)."""
    return next((f for f in in_flight if not f.void and f.size), None)


class Pipeline(Generic[F]):
    """The blocks in flight of one session, oldest first, and the schedule they are sent under.

    ``draft_len`` and ``window`` are what the ``schedule`` (``edge.schedule``: fixed, or the
    controller) chose, followed at the re-plan points; ``draft_limit`` caps a block's drafts, guesses
    included (the verifier's limit).
    """

    def __init__(self, draft_len: int, window: int, schedule: Schedule, draft_limit: int | None = None) -> None:
        self.in_flight: deque[F] = deque()
        self.draft_len, self.window, self.schedule = draft_len, window, schedule
        self.draft_limit = draft_limit
        self.max_empty_blocks = 1  # empty blocks one frame may stand for (the verifier's terms)
        self.hold = False  # blocks in flight rest on a wrong guess of the first token: send none until they drain
        self.leaving_cloud = False  # a switch from a cloud stretch to drafting waits for the empty blocks to drain
        self.since_plan = 0  # tokens committed since the schedule last chose
        self.cloud_window = CLOUD_WINDOW  # a schedule that drafts nothing: empty blocks in flight (``head_start``)

    def __iter__(self) -> Iterator[F]:
        return iter(self.in_flight)

    def __len__(self) -> int:
        return len(self.in_flight)

    # -- the schedule ------------------------------------------------------
    def follow(self, plan: Plan) -> None:
        self.draft_len, self.window = plan.draft_len, plan.window

    def replan(self, drafting: bool = False, tokens_left: int | None = None) -> Plan | None:
        """Let the schedule choose again where the decode loop asks it: when a new chain starts (every
        block in flight void, none being drafted), and every ``REPLAN_TOKENS`` tokens of a chain (drafting
        only) or of a cloud stretch (there a switch to drafting waits for the pipeline to drain);
        ``tokens_left``: what the token limit leaves of the generation (None: unbounded). Returns the
        plan a new chain follows (None: no new chain)."""
        control = self.schedule
        if not drafting and all(f.void for f in self.in_flight):
            plan = control.plan(tokens_left=tokens_left)
            self.follow(plan)
            self.since_plan, self.leaving_cloud = 0, False
            return plan
        if self.since_plan >= REPLAN_TOKENS:
            self.since_plan = 0
            if self.draft_len == 0:
                self.leaving_cloud = control.plan(tokens_left=tokens_left).draft_len > 0
            else:
                self.follow(control.plan(drafting_only=True, tokens_left=tokens_left))
        return None

    # -- how a session starts ------------------------------------------------
    def head_start(self, round_trip_s: float, token_s: float) -> Plan | None:
        """A plan to start with the cloud alone from the first token: a session that drafts nothing has its
        window of empty blocks go behind the Open, as ``Generate`` streams (else the cloud would idle a
        round trip after the first token; lock-step, one block at a time: None); one that drafts, its
        schedule's (``Controller.start``, on a round trip and the cloud's seconds a token alone), if any.
        Not followed yet: the caller follows it when it takes effect. A schedule that drafts nothing (the
        caller's, or the verifier's terms) keeps the window the link asks for: ``cloud_window``
        (``cloud_window_for``)."""
        self.cloud_window = cloud_window_for(round_trip_s, token_s)
        if not self.draft_len:
            return Plan(0, self.cloud_window, None) if self.window > 1 else None
        return self.schedule.start(round_trip_s, token_s)

    def takes_early_block(self, drafts_left: int) -> bool:
        """Whether the first block is drafted while the prompt is prefilled, ``drafts_left`` drafts left in the
        limit past the first token and the correction (pipelined and drafting)."""
        return self.draft_len > 0 and self.window >= 2 and drafts_left >= 1

    def hold_if(self, wrong_guess: bool) -> None:
        """The blocks in flight rest on the early block, drafted on a guess of the first token: when that
        was wrong, send none until they drain (``hold``)."""
        self.hold = wrong_guess and bool(self.in_flight)

    def shadow_due(self) -> bool:
        """In a cloud stretch: whether the drafter's would-be proposal for the token just decoded is
        measured (``Schedule.shadow_due``)."""
        return self.schedule.shadow_due(self.since_plan)

    # -- sending -----------------------------------------------------------
    def may_send(self) -> bool:
        """Whether another block may go now."""
        if len(self.in_flight) >= self.window or self.leaving_cloud or self.hold:
            return False
        if self.in_flight and self.in_flight[0].first:  # the first token is in hand: it reaches the caller first
            return False
        if self._in_stretch() and self.window - len(self.in_flight) < stretch_top_up(self.window, self.max_empty_blocks):
            return False
        return may_follow(self.in_flight, self.draft_len)

    def _in_stretch(self) -> bool:
        """The cloud decodes alone and the last block in flight is one of its empty blocks."""
        return self.draft_len == 0 and bool(self.in_flight) and self.in_flight[-1].size == 0

    def live(self) -> list[F]:
        return [f for f in self.in_flight if not f.void]

    def next_block(self, committed_end: int, end_limit: int) -> NextBlock | None:
        """The next block to draft, with ``committed_end`` the position after the committed tokens and
        ``end_limit`` the position the token limit ends at; None when the limit is reached by what is in
        flight (wait for it)."""
        live = self.live()
        start = flight_end(live[-1]) if live else committed_end
        if start >= end_limit:
            return None
        guesses = 0 if live else len(self.in_flight)
        drafts_left = end_limit - start - 1  # the correction or bonus comes inside the limit
        drafts = min(self.draft_len + guesses if self.draft_len else 0, drafts_left)
        if self.draft_limit is not None:
            drafts = min(drafts, self.draft_limit)
        if drafts <= 0 and live and live[-1].size:
            return None
        empty_blocks = 1
        if self.draft_len == 0:  # the cloud alone: as many empty blocks as the window has room for, in one frame
            empty_blocks = max(min(self.window - len(self.in_flight), self.max_empty_blocks, end_limit - start), 1)
        return NextBlock(start, max(drafts, 0), min(guesses, max(drafts, 0)), drafts_left, empty_blocks)

    def sent(self, flight: F) -> None:
        self.in_flight.append(flight)

    # -- verdicts ----------------------------------------------------------
    def answered(self) -> F:
        """The oldest block in flight, which the next verdict answers."""
        return self.in_flight.popleft()

    def settle(self, sent: F, committed: int, *, correction: bool, stale: bool, chain_broken: bool = False) -> bool:
        """After ``sent``'s verdict committed ``committed`` tokens: whether everything in flight is void
        now (then it is marked so). A correction voids it; so does a stale verdict for a block the edge
        counted on, and ``chain_broken``: a token decoded for a stale block left the first live block
        unusable (a wrong guess of it)."""
        self.since_plan += committed
        voids = correction or (stale and (not sent.void or chain_broken))
        if voids:
            for flight in self.in_flight:
                flight.void = True
        if not self.in_flight:
            self.hold = False
        return voids

    def clear(self) -> None:
        """Forget everything in flight (the stream was lost and the session resumed)."""
        self.in_flight.clear()
        self.hold = False


@dataclass(frozen=True)
class LiveVerdict:
    """What a live verdict measured, for the schedule (``observe_verdict``)."""

    drafted: int  # the block's drafts the verifier verified (0: an empty block, or every draft already committed)
    held: int  # drafts the block held (0: empty)
    accepted: int
    trip_s: float  # send to verdict
    draft_s: float  # drafting time of the verified drafts
    timing: CloudTiming  # what the cloud measured of it
    tokens: int = 1  # tokens it committed (an empty block's: the token, after the cloud's proposals it accepted)
    interval_s: float | None = None  # in a cloud stretch: since the last verdict (the cloud's real pace)
    early: bool = False  # sent before the Opened (the early block, a head start's block): its trip spans the prefill
    wrong_guess: bool = False  # the early block rests on a wrong guess of the first token
    hedged: bool = False  # the block carried hedge branches
    gained: int = 0  # ... tokens a taken branch committed past the correction
    hedge_s: float = 0.0  # ... drafting time of its branches
    skipped: int = 0  # drafts it held that were committed before it was verified: the verified start at this index


@dataclass(frozen=True)
class StaleVerdict:
    """What a stale verdict measured, for the schedule (``observe_stale_verdict``)."""

    committed: int  # tokens the cloud decoded for the block (0: answered empty)
    rebased: int  # ... of them, drafts sent for those positions that it accepted where they lay
    trip_s: float | None  # send to verdict (None: sent before the Opened, not a measurement)
    timing: CloudTiming
    drafted: int  # the void block's drafts, and their drafting time
    draft_s: float
    # A live chain's first block's drafts at those tokens as acceptance trials (greedy and coupled modes):
    # (its draft index there, drafts compared, right in a row); None: none.
    guess_trials: tuple[int, int, int] | None = None


def observe_verdict(schedule: Schedule, seen: LiveVerdict) -> bool:
    """Feed ``schedule`` what a live verdict measures; True when it answered a token the cloud decoded
    alone (a shadow proposal may be due: ``Pipeline.shadow_due``).

    The early block measures only its acceptance (its trip spans the prefill), and nothing when it was
    drafted on a wrong guess of the first token; an empty block sent before the Opened (a head start)
    measures all but its trip. A hedged block's forward is not the chain's (its branches' rows): it is a
    point of the row-cost curve, not of ``forward_s``."""
    timing = seen.timing
    if seen.early and seen.held:
        if not seen.wrong_guess:
            schedule.observe_acceptance(seen.drafted, seen.accepted, first=seen.skipped)
        return False
    schedule.observe_forward(timing.forward_rows, timing.forward_s)
    if seen.drafted:
        schedule.observe_block(seen.drafted, seen.accepted, seen.trip_s, seen.draft_s, timing.cloud_s,
                                 0.0 if seen.hedged else timing.forward_s, first=seen.skipped)
        if seen.hedged:
            schedule.observe_hedge(seen.gained, seen.hedge_s)
        return False
    if seen.held:
        return False  # every draft was already committed: nothing measured
    schedule.observe_cloud_token(None if seen.early else seen.trip_s, timing.cloud_s, seen.interval_s,
                                   timing.forward_s, tokens=seen.tokens)
    return True


def observe_stale_verdict(schedule: Schedule, seen: StaleVerdict) -> None:
    """Feed ``schedule`` what a stale verdict measures: the forward, what the cloud decoded for the void
    block (so a drafter whose every chain goes stale is still measured), and the live chain's guesses
    of those tokens as acceptance trials."""
    if seen.guess_trials is not None:
        first, trials, right = seen.guess_trials
        schedule.observe_acceptance(trials, right, first=first)
    schedule.observe_forward(seen.timing.forward_rows, seen.timing.forward_s)
    schedule.observe_stale(seen.committed, seen.rebased, seen.timing.forward_s, trip_s=seen.trip_s,
                             cloud_s=seen.timing.cloud_s, drafted=seen.drafted, draft_s=seen.draft_s)
