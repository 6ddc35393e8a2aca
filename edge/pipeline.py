"""The edge's side of the pipelining protocol, as pure state: no I/O, no clock, no drafter.

One session's chain of blocks in flight (``docs/pipelining.md``; the words are
defined in ``docs/glossary.md``). ``Pipeline`` says

- whether another block may go now (the window has room, the last block in
  flight asks for a follower or is void, no hold, no switch out of a cloud
  stretch pending, the first position answered first);
- where the next block starts and how many drafts it holds: a new chain starts
  at the committed end, its first drafts guessing the tokens that the void
  blocks in flight will bring (one each); a block that continues a live chain
  starts where the last live block ends; the token limit leaves room for the
  correction or bonus;
- what a verdict voids: a correction, a stale verdict for a block the edge
  counted on, or a token decoded for a stale block that the live chain's first
  block guessed wrong void every block in flight;
- where the controller chooses again (a new chain, every ``REPLAN_TOKENS``
  tokens of a chain or of a cloud stretch) and when a shadow proposal is due;
- what each verdict measures for the controller (``observe_verdict``).

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

from edge.controller import REPLAN_TOKENS, SHADOW_EVERY, Controller, Plan

__all__ = ["Flight", "NextBlock", "Pipeline", "observe_verdict", "may_follow", "more_follows", "first_live"]


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
    room: int  # tokens the limit leaves from ``start_position``, the correction or bonus aside


def more_follows(drafted: int, room: int, window: int) -> bool:
    """Whether a block of ``drafted`` drafts asks for a follower (no bonus): pipelined, not empty, and
    short of the ``room`` the limit leaves (``NextBlock.room``)."""
    return window > 1 and 0 < drafted < room


def first_live(in_flight: Iterable[F]) -> F | None:
    """The first live block in flight with drafts (a new chain's first block, when one was sent)."""
    return next((f for f in in_flight if not f.void and f.size), None)


class Pipeline(Generic[F]):
    """The blocks in flight of one session, oldest first, and the schedule they are sent under.

    ``draft_len`` and ``window`` are the schedule (a fixed one, or the ``controller``'s choice at the
    re-plan points); ``draft_limit`` caps a block's drafts, guesses included (the verifier's limit).
    """

    def __init__(self, draft_len: int, window: int, controller: Controller | None = None,
                 draft_limit: int | None = None) -> None:
        self.in_flight: deque[F] = deque()
        self.draft_len, self.window, self.controller = draft_len, window, controller
        self.draft_limit = draft_limit
        self.hold = False  # blocks in flight rest on a wrong guess of the first token: send none until they drain
        self.leaving_cloud = False  # a switch from a cloud stretch to drafting waits for the empty blocks to drain
        self.since_plan = 0  # tokens committed since the controller last chose

    def __iter__(self) -> Iterator[F]:
        return iter(self.in_flight)

    def __len__(self) -> int:
        return len(self.in_flight)

    # -- the schedule ------------------------------------------------------
    def follow(self, plan: Plan) -> None:
        self.draft_len, self.window = plan.draft_len, plan.window

    def replan(self, drafting: bool = False) -> Plan | None:
        """Let the controller choose again where the decode loop asks it: when a new chain starts (every
        block in flight void, none being drafted), and every ``REPLAN_TOKENS`` tokens of a chain (drafting
        only) or of a cloud stretch (there a switch to drafting waits for the pipeline to drain). Returns
        the plan a new chain follows (None: no new chain, or no controller)."""
        control = self.controller
        if control is None:
            return None
        if not drafting and all(f.void for f in self.in_flight):
            plan = control.plan()
            self.follow(plan)
            self.since_plan, self.leaving_cloud = 0, False
            return plan
        if self.since_plan >= REPLAN_TOKENS:
            self.since_plan = 0
            if self.draft_len == 0:
                self.leaving_cloud = control.plan().draft_len > 0
            else:
                self.follow(control.plan(drafting_only=True))
        return None

    def shadow_due(self) -> bool:
        """In a cloud stretch: whether the drafter's would-be proposal for the token just decoded is
        measured (every token where the drafter is fast enough, else every ``SHADOW_EVERY``)."""
        control = self.controller
        return control is not None and (control.shadows_every_token() or self.since_plan % SHADOW_EVERY == 0)

    # -- sending -----------------------------------------------------------
    def may_send(self) -> bool:
        """Whether another block may go now."""
        if len(self.in_flight) >= self.window or self.leaving_cloud or self.hold:
            return False
        if self.in_flight and self.in_flight[0].first:  # the first token is in hand: it reaches the caller first
            return False
        return may_follow(self.in_flight, self.draft_len)

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
        room = end_limit - start - 1  # the correction or bonus comes inside the limit
        drafts = min(self.draft_len + guesses if self.draft_len else 0, room)
        if self.draft_limit is not None:
            drafts = min(drafts, self.draft_limit)
        if drafts <= 0 and live and live[-1].size:
            return None
        return NextBlock(start, max(drafts, 0), min(guesses, max(drafts, 0)), room)

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


def observe_verdict(controller: Controller, *, early: bool, wrong_guess: bool, drafted: int, held: int,
                    accepted: int, trip_s: float, draft_s: float, cloud_s: float, forward_s: float,
                    interval_s: float | None, forward_rows: int = 0, tokens: int = 1, hedged: bool = False,
                    gained: int = 0, hedge_s: float = 0.0) -> bool:
    """Feed ``controller`` what a live verdict measures; True when it answered a token the cloud decoded
    alone (a shadow proposal may be due: ``Pipeline.shadow_due``).

    ``drafted``: the block's drafts the verifier verified, of the ``held`` it held (0: empty);
    ``draft_s``: their drafting time; ``forward_rows``: the session's rows in the forward (a point of
    the row-cost curve); ``tokens``: what the verdict committed (an empty block's: the token, after
    any the cloud proposed itself and accepted). The early block measures only its acceptance (its
    trip spans the prefill), and nothing when it was drafted on a wrong guess of the first token; an
    empty block sent before the Opened (a head start) measures all but its trip. A hedged block's
    forward is not the chain's (its branches' rows): it is a point of the curve, not of ``forward_s``."""
    if early and held:
        if not wrong_guess:
            controller.observe_acceptance(drafted, accepted)
        return False
    controller.observe_forward(forward_rows, forward_s)
    if drafted:
        controller.observe_block(drafted, accepted, trip_s, draft_s, cloud_s, 0.0 if hedged else forward_s)
        if hedged:
            controller.observe_hedge(gained, hedge_s)
        return False
    if held:
        return False  # every draft was already committed: nothing measured
    controller.observe_cloud_token(None if early else trip_s, cloud_s, interval_s, forward_s, tokens=tokens)
    return True
