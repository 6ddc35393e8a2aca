"""Pipelined split decoding followed block by block, stale blocks and guesses included.

The controller prices a chain's stale blocks in closed form
(``shared.acceptance.pipelined_chain``): they overlap the next chain's first
block, and each missed guess costs a share of the window. Where stale blocks
make many of the tokens (a weak drafter on a long round trip) that is
optimistic: they hold window slots and the cloud's forwards like any other
block, and the verifier's queue builds behind them. The performance model
follows the protocol instead, with random acceptance, over whole generations:

- the edge (one thread, ``edge.decode_loop``) drafts and sends while the window
  has room and the last block in flight asks for a follower (or everything in
  flight is void), then reads the oldest verdict; a verdict that arrives while
  it drafts is read at the next token, and one that voids the block being
  drafted ends it there (it is not sent); a chain's first block drafts a guess
  for each void block in flight besides its own drafts; on a correction, on a
  stale verdict for a block it counted on, or on a token decoded for a void
  block that its live chain guessed wrong, everything in flight is void;
- a block reaches the cloud ``up_s(drafts)`` + RTT/2 after it is sent; the
  cloud answers blocks in order, one forward at a time
  (``cloud.session.VerifierSession.verify_chain_steps``): a live block with
  every later live block already there (``verify_s`` and ``per_extra_block_s``
  each), or one stale block: with a token decoded for it (``fill_s``, after
  ``rebased_per_fill`` rebased drafts on average) when no usable block waits
  behind it and, after a correction, the forward would be over before the
  edge's next block is due, or (``fill_overruns``: greedy and coupled modes)
  its overrun pays at the odds ``alpha[0]`` (``cloud.next_block``); otherwise
  at once, empty.
  Its verdict is read RTT/2 + ``down_s`` later;
- a live block's drafts are accepted with the conditional ``alpha``; a
  correction makes the chain's later blocks stale; a chain's first block is
  usable when every token decoded under its guesses (their verdicts not read
  when it was drafted) was guessed right, each with probability
  ``token_guessed``; an empty one always is (it asks for the next token);
- the early block (``edge.early_block``) is at the cloud when the first token
  leaves it; on a wrong guess of that token (``alpha[0]``) it commits one token
  and the edge chains nothing on it;
- a forward costs ``forward_s`` of the rows it verifies (a block's drafts and
  the pending token; a chain's blocks together; one row for a token alone).

The adaptive schedule (``simulate_adaptive``) closes the loop: a session's own
``edge.controller.Controller``, fresh each generation, is fed what each
simulated verdict measures (acceptance, trips, the cloud's time, forwards,
stale blocks' tokens) and chooses each chain's draft length and window, and
when the cloud decodes alone (empty blocks, each its own one-row forward, a
window of them in flight, the drafter's shadow proposals, accepted as the
draft of a block they stand for, costing the edge a draft each), at the
points where ``edge.decode_loop`` asks it. Its priors, its first chains and
its switches are in the prediction; a short generation pays for them.

Deterministic for a seed. Pure arithmetic: no clock, no I/O.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from cloud.next_block import fill_overrun_pays
from edge.controller import Controller
from edge.pipeline import Pipeline, first_live, more_follows, observe_verdict
from shared.stats import Ewma

__all__ = ["BlockCosts", "SimulatedRun", "simulate_pipelined", "simulate_adaptive"]


@dataclass(frozen=True)
class BlockCosts:
    """What a block costs where, in seconds (``up_s``: its Draft frame up, by drafts it holds)."""

    alpha: list[float]  # conditional acceptance per position in a block (the last repeats)
    draft_s: float  # the drafter, per drafted token (guesses included)
    up_s: Callable[[int], float]
    rtt_s: float
    down_s: float  # a Verdict frame down
    forward_s: Callable[[int], float]  # a forward over this many rows (the drafts verified, one more; 1: a token alone)
    fill_s: float  # a stale block's forward (its token, after the rebased drafts it verifies)
    rebased_per_fill: float = 0.0  # rebased drafts such a forward accepts, on average
    decode_stale: bool = True  # False: a verifier run with --stale-blocks drop answers stale blocks empty
    token_guessed: float | None = None  # P(a guess of a token decoded for a stale block is right); None: alpha[0]
    early_drafts: int = 0  # drafts of the early block (0: none)
    fill_overruns: bool = False  # a fill may run past the next block's due time where that pays (greedy, coupled)
    guess_trials: bool = False  # a controller counts a live block's guesses of fills as acceptance trials (same modes)


@dataclass(frozen=True)
class SimulatedRun:
    """Totals over the simulated generations, each from its first token to its last."""

    generations: int
    tokens: int  # tokens committed after each first one
    seconds: float  # the edge's time for them
    cloud_s: float  # the cloud's forwards
    verdicts: int  # stale ones included
    stale: int
    sent: int  # blocks sent
    sent_drafts: int  # drafts they held (guesses included)
    guessing: int  # a chain's first blocks drafted on guesses
    guesses_held: int  # ... that were verified
    guesses: int = 0  # sent_drafts that were guesses
    empty: int = 0  # blocks sent empty (the cloud decoding alone)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def simulate_pipelined(costs: BlockCosts, draft_len: int, window: int, generation_tokens: int,
                       generations: int = 64, seed: int = 0) -> SimulatedRun:
    """``generations`` generations of ``generation_tokens`` tokens each: blocks of ``draft_len``
    drafts, ``window`` in flight at most."""
    if draft_len < 1 or window < 1:
        raise ValueError("need draft_len >= 1 and window >= 1")
    return _simulate(costs, lambda: (draft_len, window, None), generation_tokens, generations, seed)


def simulate_adaptive(costs: BlockCosts, controller: Callable[[], Controller], generation_tokens: int,
                      generations: int = 64, seed: int = 0) -> SimulatedRun:
    """As ``simulate_pipelined``, each generation under a fresh ``controller()`` (a session has one a
    generation), fed what the simulated verdicts measure as ``edge.decode_loop`` feeds it: it chooses
    each chain's draft length and window, again every ``REPLAN_TOKENS`` tokens of a chain, and when
    the cloud decodes alone (empty blocks, a window of them in flight, one forward of one row each,
    the drafter's shadow proposals accepted as the draft they stand for, costing the edge a draft each)."""
    def start() -> tuple[int, int, Controller]:
        session = controller()
        return session.draft_len, session.drafting_window, session

    return _simulate(costs, start, generation_tokens, generations, seed)


def _simulate(costs: BlockCosts, schedule: Callable[[], tuple[int, int, Controller | None]], generation_tokens: int,
              generations: int, seed: int) -> SimulatedRun:
    if generation_tokens < 2 or generations < 1:
        raise ValueError("need generation_tokens >= 2 and generations >= 1")
    costs = replace(costs, alpha=[min(max(float(a), 0.0), 1.0) for a in costs.alpha] or [0.0])
    if costs.token_guessed is None:
        costs = replace(costs, token_guessed=costs.alpha[0])
    rng = random.Random(seed)
    runs = [_Generation(costs, *schedule(), rng).run(generation_tokens - 1) for _ in range(generations)]
    return SimulatedRun(generations, *(sum(values) for values in zip(*runs)))


@dataclass
class _Block:
    """A simulated block (an ``edge.pipeline.Flight``) with its times at the cloud."""

    chain: int  # the chain it was drafted in (a correction or a wrong guess starts the next)
    drafts: int  # drafts for the chain's positions
    guesses: int  # guesses of the tokens the void blocks in flight bring (a chain's first block)
    opens_chain: bool  # a chain's first block
    more_follows: bool
    sent_at: float
    at_cloud: float
    start_position: int = 0  # counted from the first generated token
    size: int = 0  # drafts and guesses as sent
    verdict_at: float = math.inf
    committed: int = 0
    accepted: int = 0
    forward_s: float = 0.0  # the forward that answered it (0: answered without one)
    done_at: float = 0.0  # ... its end at the cloud
    ends_chain: bool = False  # a correction
    stale: bool = False
    mismatch: bool = False  # a token decoded for it, guessed wrong by chains drafted before its verdict was read
    void: bool = False  # the edge's view: drafted past a token the verifier will not commit
    early: bool = False  # the early block
    judged: int = 0  # its guesses judged by tokens decoded for stale blocks (a chain's first block)
    guess_wrong: bool = False  # the early block, drafted on a wrong guess of the first token
    first: bool = False  # (the first position, answered with the Opened, is not simulated)

    @property
    def empty(self) -> bool:
        """Sent with no drafts: it asks the cloud for one token (the cloud decoding alone)."""
        return self.drafts == 0 and self.guesses == 0


@dataclass
class _Tally:
    """One generation's counts (``SimulatedRun``'s fields)."""

    committed: int = 0
    seconds: float = 0.0
    cloud_s: float = 0.0
    verdicts: int = 0
    stale: int = 0
    sent: int = 0
    sent_drafts: int = 0
    guessing: int = 0
    guesses_held: int = 0
    guesses: int = 0
    empty: int = 0


class _Generation:
    """One generation: the edge's loop (``run``, an ``edge.pipeline.Pipeline`` on a simulated clock) and
    the cloud's (``_Cloud``); ``controller`` (None: a fixed schedule) chooses as the decode loop lets it."""

    def __init__(self, costs: BlockCosts, draft_len: int, window: int, controller: Controller | None,
                 rng: random.Random) -> None:
        self.costs, self.rng = costs, rng
        self.pipeline: Pipeline[_Block] = Pipeline(draft_len, window, controller)
        self.pending: deque[_Block] = deque()  # sent, not yet answered by the cloud
        self.cloud = _Cloud(self, self.pending)
        self.tally = _Tally()
        self.chain, self.now, self.last_read = 0, 0.0, 0.0

    def accepted(self, drafts: int) -> int:
        alpha = self.costs.alpha
        for i in range(drafts):
            if self.rng.random() >= alpha[min(i, len(alpha) - 1)]:
                return i
        return drafts

    def stale_decode(self) -> int:
        """Tokens a stale block's forward commits: the one decoded, after the rebased drafts it accepts."""
        whole = int(self.costs.rebased_per_fill)
        return 1 + whole + (self.rng.random() < self.costs.rebased_per_fill - whole)

    def observe(self, block: _Block, interval_s: float | None, guesser: _Block | None) -> float:
        """Feed the controller what ``block``'s verdict measures (as ``edge.decode_loop`` does), and for
        a token decoded for a stale block, what it says of ``guesser``'s guess of it; the edge's seconds
        that took (a shadow proposal)."""
        control, costs = self.pipeline.controller, self.costs
        if block.stale:
            drafted = block.drafts + block.guesses
            control.observe_stale(block.committed, max(block.committed - 1, 0), block.forward_s,
                                  trip_s=None if block.early else block.verdict_at - block.sent_at,
                                  cloud_s=block.done_at - block.at_cloud, drafted=drafted, draft_s=drafted * costs.draft_s)
            if block.committed and guesser is not None and costs.guess_trials:
                control.observe_acceptance(1, int(not block.mismatch), first=guesser.judged)
                guesser.judged += 1
            return 0.0
        cloud_token = observe_verdict(
            control, early=block.early, wrong_guess=block.guess_wrong, drafted=block.drafts, held=block.size,
            accepted=block.accepted, trip_s=block.verdict_at - block.sent_at, draft_s=block.drafts * costs.draft_s,
            cloud_s=block.done_at - block.at_cloud, forward_s=block.forward_s, interval_s=interval_s)
        if cloud_token and self.pipeline.shadow_due():
            alpha = costs.alpha[min(control.shadow_position, len(costs.alpha) - 1)]
            control.observe_shadow(self.rng.random() < alpha, costs.draft_s)
            return costs.draft_s
        return 0.0

    def send(self, block: _Block) -> None:
        tally = self.tally
        self.pipeline.sent(block)
        self.pending.append(block)
        tally.sent, tally.sent_drafts = tally.sent + 1, tally.sent_drafts + block.drafts + block.guesses
        tally.empty, tally.guesses = tally.empty + block.empty, tally.guesses + block.guesses

    def answered_before(self, at: float) -> bool:
        """Whether the oldest block in flight has its verdict before ``at`` (the cloud answers it
        first where that can be: then it started before a block sent at ``at`` would be there)."""
        costs, cloud, head = self.costs, self.cloud, self.pipeline.in_flight[0]
        if head.verdict_at == math.inf:
            earliest = max(cloud.free_at, head.at_cloud) + costs.rtt_s / 2 + costs.down_s
            if earliest >= at:
                return False
            while head.verdict_at == math.inf:
                cloud.step()
        return head.verdict_at < at

    def read(self) -> bool:
        """Read the oldest verdict in flight (at its arrival, or now); True when it voids what is
        drafted after it (a block being drafted included)."""
        pipe, tally = self.pipeline, self.tally
        block = pipe.answered()
        while block.verdict_at == math.inf:
            self.cloud.step()
        self.now = max(self.now, block.verdict_at)
        if pipe.controller is not None:
            interval = self.now - self.last_read if block.empty and pipe.since_plan > 0 else None
            self.last_read = self.now
            guesser = first_live(pipe)
            guesser = guesser if guesser is not None and guesser.opens_chain and guesser.guesses > guesser.judged else None
            self.now += self.observe(block, interval, guesser)
        tally.verdicts, tally.stale, tally.committed = tally.verdicts + 1, tally.stale + block.stale, \
            tally.committed + block.committed
        if block.opens_chain and block.guesses:
            tally.guessing, tally.guesses_held = tally.guessing + 1, tally.guesses_held + (not block.stale)
        return pipe.settle(block, block.committed, correction=block.ends_chain, stale=block.stale,
                           chain_broken=block.mismatch)

    def draft_and_send(self, tokens_wanted: int) -> bool:
        """Draft and send what may go (``edge.decode_loop``); False when a verdict read while a block was
        drafted voided it (it is not sent: draft again at once)."""
        costs, pipe = self.costs, self.pipeline
        while pipe.may_send():
            nxt = pipe.next_block(self.tally.committed, tokens_wanted)
            if nxt is None:
                break
            opens_chain = not pipe.live()
            guesses, drafts = nxt.guesses, nxt.drafts - nxt.guesses
            # Drafting reads each verdict that arrives meanwhile (between two tokens) and ends at one
            # that voids the block, which then does not go.
            began, done_at = self.now, self.now + nxt.drafts * costs.draft_s
            while nxt.drafts and len(pipe) and self.answered_before(done_at):
                steps = math.ceil(max(pipe.in_flight[0].verdict_at - began, 0.0) / costs.draft_s - 1e-9)
                self.now = began + steps * costs.draft_s
                if self.read():
                    return False
            self.chain += opens_chain
            self.now = done_at
            self.send(_Block(self.chain, drafts, guesses, opens_chain,
                             more_follows(nxt.drafts, nxt.room, pipe.window), sent_at=self.now,
                             at_cloud=self.now + costs.up_s(nxt.drafts) + costs.rtt_s / 2,
                             start_position=nxt.start_position, size=nxt.drafts))
        return True

    def run(self, tokens_wanted: int) -> tuple[int, float, float, int, int, int, int, int, int, int, int]:
        costs, pipe, tally = self.costs, self.pipeline, self.tally
        early = min(costs.early_drafts, tokens_wanted - 1)
        if early > 0 and pipe.window > 1:
            self.chain = 1
            block = _Block(self.chain, early, 0, True, more_follows=True, sent_at=-math.inf,
                           at_cloud=-(costs.rtt_s / 2 + costs.down_s), size=early, early=True)
            block.guess_wrong = self.rng.random() >= costs.alpha[0]
            pipe.hold = block.guess_wrong
            self.send(block)
        while tally.committed < tokens_wanted:
            pipe.replan()  # (``edge.decode_loop``'s choices, at the same points)
            if self.draft_and_send(tokens_wanted) and len(pipe) and tally.committed < tokens_wanted:
                self.read()
        return (min(tally.committed, tokens_wanted), self.now, self.cloud.busy_s, tally.verdicts, tally.stale,
                tally.sent, tally.sent_drafts, tally.guessing, tally.guesses_held, tally.guesses, tally.empty)


class _Cloud:
    """The verifier's side of one generation."""

    def __init__(self, generation: _Generation, pending: deque[_Block]) -> None:
        self.generation, self.costs, self.pending = generation, generation.costs, pending
        self.free_at = self.busy_s = 0.0
        self.chain, self.alive = 0, True  # the chain it verifies, until a correction ends it
        self.filled = 0  # tokens decoded for stale blocks since the last correction
        self.fills: list[_Block] = []  # ... the blocks they were decoded for
        self.corrected_at: float | None = None  # a correction's verdict left; None once the next block came
        self.gap_s = Ewma()  # from a correction's verdict to the next chain's first block

    def _usable(self, block: _Block) -> bool:
        if block.chain == self.chain:
            return self.alive
        # A chain's first block is usable unless a token decoded for a void block before the edge read
        # its verdict moved the committed end from under it with a guess of it that was wrong. An empty
        # block asks for the next token wherever that is (``cloud.session``: a token decoded for a
        # stale block is a bonus, not a correction, so the epoch it was sent at still holds).
        return block.opens_chain and block.chain > self.chain and (block.empty or not any(
            fill.mismatch and fill.verdict_at > block.sent_at for fill in self.fills))

    def step(self) -> None:
        """Answer the front of the pending blocks (one forward, or an empty stale verdict)."""
        costs, pending = self.costs, self.pending
        start = max(self.free_at, pending[0].at_cloud)
        there = [b for b in pending if b.at_cloud <= start]
        if self.corrected_at is not None:
            came = next((b for b in there if b.chain > self.chain), None)
            if came is not None:
                self.gap_s.add(max(came.at_cloud - self.corrected_at, 0.0))
                self.corrected_at = None
        head = pending.popleft()
        if not self._usable(head):
            head.stale = True
            due = None if self.corrected_at is None or self.gap_s.value is None else self.corrected_at + self.gap_s.value
            if not costs.decode_stale or any(self._usable(b) for b in there[1:]) or not self._fill_in_time(start, due):
                head.done_at, head.verdict_at = start, start + costs.rtt_s / 2 + costs.down_s
                return
            head.committed = self.generation.stale_decode()
            head.mismatch = self.generation.rng.random() >= costs.token_guessed
            self.filled += head.committed
            self.fills.append(head)
            self._ran(start, costs.fill_s, [head])
            return
        if head.chain != self.chain:  # a new chain: the tokens decoded under its guesses are skipped,
            head.drafts += max(head.guesses - self.filled, 0)  # its other guesses are drafts
            self.chain, self.alive, self.filled, self.fills = head.chain, True, 0, []
        batch = [head]  # with every later block of the chain there (each empty block is a forward of its own)
        while not head.empty and pending and pending[0].at_cloud <= start and pending[0].chain == self.chain:
            batch.append(pending.popleft())
        for i, block in enumerate(batch):
            block.accepted = 0 if block.guess_wrong else self.generation.accepted(block.drafts)
            block.committed = block.accepted if block.accepted == block.drafts and block.more_follows else block.accepted + 1
            if block.accepted < block.drafts:  # a correction: the chain's later blocks are stale
                block.ends_chain, self.alive = True, False
                pending.extendleft(reversed(batch[i + 1:]))
                del batch[i + 1:]
                break
        self._ran(start, costs.forward_s(sum(b.drafts for b in batch) + 1), batch)
        if not self.alive:
            self.corrected_at, self.filled, self.fills = self.free_at, 0, []

    def _fill_in_time(self, start: float, due: float | None) -> bool:
        """Whether a fill started at ``start`` ends by ``due`` (None: no deadline) or its overrun pays."""
        overrun = start + self.costs.fill_s - (math.inf if due is None else due)
        return overrun <= 0 or (self.costs.fill_overruns and fill_overrun_pays(overrun, due - start, self.costs.alpha[0]))

    def _ran(self, start: float, seconds: float, answered: list[_Block]) -> None:
        self.free_at = start + seconds
        self.busy_s += seconds
        for block in answered:
            block.forward_s, block.done_at = seconds, self.free_at
            block.verdict_at = self.free_at + self.costs.rtt_s / 2 + self.costs.down_s
