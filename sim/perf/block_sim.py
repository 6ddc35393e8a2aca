"""Pipelined split decoding followed block by block over whole generations: the edge on a clock.

The controller prices a chain's stale blocks in closed form
(``shared.acceptance.pipelined_chain``); where they make many of the tokens (a
weak drafter on a long round trip) that is optimistic, so the performance model
follows the protocol instead. The edge's side is the product's own
``edge.pipeline.Pipeline`` (what may follow, where a block starts, what a
verdict voids, re-plan points, shadows, what a verdict measures); this module
adds only a clock and the costs (``BlockCosts``): drafting at ``draft_s`` a
token, reading each verdict that arrives meanwhile (one that voids the block
being drafted ends it, unsent), the link (``up_s``, RTT, ``down_s``), random
acceptance by position (``alpha``), and the early block (or a head start's
empty blocks, where the session's controller starts with the cloud alone) at the
cloud when the first token leaves it. The verifier's side, on the same clock, is
``sim.perf.verifier_sim``. ``simulate_adaptive`` closes the loop with a
session's own ``edge.controller.Controller``, fresh each generation.

Deterministic for a seed. Pure arithmetic: no clock, no I/O.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import fields, replace

from cloud.limits import ServiceLimits
from edge.controller import Controller
from edge.pipeline import (
    LiveVerdict,
    Pipeline,
    StaleVerdict,
    first_live,
    more_follows,
    observe_stale_verdict,
    observe_verdict,
)
from edge.schedule import FixedSchedule, Schedule
from edge.verifier_protocol import CloudTiming
from sim.perf.block_costs import BlockCosts, SimBlock, SimulatedRun
from sim.perf.verifier_sim import VerifierSim

__all__ = ["BlockCosts", "SimulatedRun", "simulate_pipelined", "simulate_adaptive"]


def simulate_pipelined(costs: BlockCosts, draft_len: int, window: int, generation_tokens: int,
                       generations: int = 64, seed: int = 0) -> SimulatedRun:
    """``generations`` generations of ``generation_tokens`` tokens each: blocks of ``draft_len``
    drafts, ``window`` in flight at most."""
    if draft_len < 1 or window < 1:
        raise ValueError("need draft_len >= 1 and window >= 1")
    return _simulate(costs, lambda: (draft_len, window, FixedSchedule(draft_len, window)), generation_tokens,
                     generations, seed)


def simulate_adaptive(costs: BlockCosts, controller: Callable[[], Controller], generation_tokens: int,
                      generations: int = 64, seed: int = 0) -> SimulatedRun:
    """As ``simulate_pipelined``, each generation under a fresh ``controller()`` (a session has one a
    generation), fed what the simulated verdicts measure as ``edge.decode_loop`` feeds it: it chooses
    each chain's draft length and window, again every ``REPLAN_TOKENS`` tokens of a chain, and when
    the cloud decodes alone (empty blocks, a window of them in flight, one forward of one row each,
    the drafter's shadow proposals accepted as the draft they stand for, costing the edge a draft each)."""
    def start() -> tuple[int, int, Controller]:  # (as the decode loop: the first chain at the cap, its window)
        session = controller()
        return session.max_draft_len, session.drafting_window, session

    return _simulate(costs, start, generation_tokens, generations, seed)


def _simulate(costs: BlockCosts, schedule: Callable[[], tuple[int, int, Schedule]], generation_tokens: int,
              generations: int, seed: int) -> SimulatedRun:
    if generation_tokens < 2 or generations < 1:
        raise ValueError("need generation_tokens >= 2 and generations >= 1")
    costs = replace(costs, alpha=[min(max(float(a), 0.0), 1.0) for a in costs.alpha] or [0.0])
    if costs.token_guessed is None:
        costs = replace(costs, token_guessed=costs.alpha[0])
    rng = random.Random(seed)
    runs = [_Generation(costs, *schedule(), rng).run(generation_tokens - 1) for _ in range(generations)]
    return SimulatedRun(**{f.name: sum(getattr(run, f.name) for run in runs) for f in fields(SimulatedRun)})


class _Generation:
    """One generation: the edge's loop (``run``, an ``edge.pipeline.Pipeline`` on a simulated clock) and
    the cloud's (``VerifierSim``); ``schedule`` (fixed, or a controller) chooses as the decode loop lets it."""

    def __init__(self, costs: BlockCosts, draft_len: int, window: int, schedule: Schedule,
                 rng: random.Random) -> None:
        self.costs, self.rng = costs, rng
        self.pipeline: Pipeline[SimBlock] = Pipeline(draft_len, window, schedule)
        self.pipeline.max_empty_blocks = ServiceLimits.max_empty_blocks  # (the service's Opened says so)
        self.pending: deque[SimBlock] = deque()  # sent, not yet answered by the cloud
        self.cloud = VerifierSim(costs, rng, self.pending)
        self.tally = SimulatedRun()
        self.chain, self.now, self.last_read = 0, 0.0, 0.0

    def observe(self, block: SimBlock, interval_s: float | None, guesser: SimBlock | None) -> float:
        """Feed the controller what ``block``'s verdict measures (as ``edge.decode_loop`` does), and for
        a token decoded for a stale block, what it says of ``guesser``'s guess of it; the edge's seconds
        that took (a shadow proposal)."""
        control, costs = self.pipeline.schedule, self.costs
        timing = CloudTiming(block.done_at - block.at_cloud, block.forward_s, block.forward_rows)
        if block.stale:
            drafted = block.drafts + block.guesses
            trials = None
            if block.committed and guesser is not None and costs.guess_trials:
                trials = (guesser.judged, 1, int(not block.mismatch))
                guesser.judged += 1
            observe_stale_verdict(control, StaleVerdict(
                block.committed, max(block.committed - 1, 0), None if block.early else block.verdict_at - block.sent_at,
                timing, drafted, drafted * costs.draft_s, guess_trials=trials))
            return 0.0
        cloud_token = observe_verdict(control, LiveVerdict(
            block.drafts, block.size, block.accepted, block.verdict_at - block.sent_at, block.drafts * costs.draft_s,
            timing, interval_s=interval_s, early=block.early, wrong_guess=block.guess_wrong, skipped=block.judged))
        if cloud_token and self.pipeline.shadow_due():
            alpha = costs.alpha[min(control.shadow_position, len(costs.alpha) - 1)]
            control.observe_shadow(self.rng.random() < alpha, costs.draft_s)
            return costs.draft_s
        return 0.0

    def send(self, block: SimBlock) -> None:
        tally = self.tally
        self.pipeline.sent(block)
        self.pending.append(block)
        tally.sent, tally.sent_drafts = tally.sent + 1, tally.sent_drafts + block.drafts + block.guesses
        tally.empty, tally.guesses = tally.empty + block.empty, tally.guesses + block.guesses

    def read(self) -> bool:
        """Read the oldest verdict in flight (at its arrival, or now); True when it voids what is
        drafted after it (a block being drafted included)."""
        pipe, tally = self.pipeline, self.tally
        block = pipe.answered()
        while block.verdict_at == math.inf:
            self.cloud.step()
        self.now = max(self.now, block.verdict_at)
        interval = self.now - self.last_read if block.empty and pipe.since_plan > 0 else None
        self.last_read = self.now
        guesser = first_live(pipe)
        guesser = guesser if guesser is not None and guesser.opens_chain and guesser.guesses > guesser.judged else None
        self.now += self.observe(block, interval, guesser)
        tally.verdicts, tally.stale, tally.tokens = tally.verdicts + 1, tally.stale + block.stale, \
            tally.tokens + block.committed
        if block.opens_chain and block.guesses:
            tally.guessing, tally.guesses_held = tally.guessing + 1, tally.guesses_held + (not block.stale)
        return pipe.settle(block, block.committed, correction=block.ends_chain, stale=block.stale,
                           chain_broken=block.mismatch)

    def draft_and_send(self, tokens_wanted: int) -> bool:
        """Draft and send what may go (``edge.decode_loop``); False when a verdict read while a block was
        drafted voided it (it is not sent: draft again at once)."""
        costs, pipe = self.costs, self.pipeline
        while pipe.may_send():
            nxt = pipe.next_block(self.tally.tokens, tokens_wanted)
            if nxt is None:
                break
            opens_chain = not pipe.live()
            guesses, drafts = nxt.guesses, nxt.drafts - nxt.guesses
            # Drafting reads each verdict that arrives meanwhile (between two tokens) and ends at one
            # that voids the block, which then does not go.
            began, done_at = self.now, self.now + nxt.drafts * costs.draft_s
            while nxt.drafts and len(pipe) and self.cloud.answers_before(pipe.in_flight[0], done_at):
                steps = math.ceil(max(pipe.in_flight[0].verdict_at - began, 0.0) / costs.draft_s - 1e-9)
                self.now = began + steps * costs.draft_s
                if self.read():
                    return False
            self.chain += opens_chain
            self.now = done_at
            at_cloud = self.now + costs.up_s(nxt.drafts) + costs.rtt_s / 2
            self.send(SimBlock(self.chain, drafts, guesses, opens_chain,
                             more_follows(nxt.drafts, nxt.drafts_left, pipe.window), sent_at=self.now,
                             at_cloud=at_cloud, start_position=nxt.start_position, size=nxt.drafts))
            for i in range(1, nxt.empty_blocks):  # (the cloud alone: one frame for several empty blocks)
                self.send(SimBlock(self.chain, 0, 0, False, False, sent_at=self.now, at_cloud=at_cloud,
                                   start_position=nxt.start_position + i))
        return True

    def run(self, tokens_wanted: int) -> SimulatedRun:
        costs, pipe, tally = self.costs, self.pipeline, self.tally
        early = min(costs.early_drafts, tokens_wanted - 1)
        start = pipe.head_start(costs.rtt_s, costs.forward_s(1))
        if start is not None:  # the head start (``edge.decode_loop``): empty blocks went behind the Open
            pipe.follow(start)
            for i in range(min(start.window, tokens_wanted)):
                self.send(SimBlock(0, 0, 0, False, False, sent_at=-math.inf, at_cloud=-(costs.rtt_s / 2 + costs.down_s),
                                   start_position=i, early=True))
        elif early > 0 and pipe.takes_early_block(tokens_wanted - 1):
            self.chain = 1
            block = SimBlock(self.chain, early, 0, True, more_follows=True, sent_at=-math.inf,
                           at_cloud=-(costs.rtt_s / 2 + costs.down_s), size=early, early=True)
            block.guess_wrong = self.rng.random() >= costs.alpha[0]
            self.send(block)
            pipe.hold_if(block.guess_wrong)
        while tally.tokens < tokens_wanted:
            pipe.replan(tokens_left=tokens_wanted - tally.tokens)  # (``edge.decode_loop``'s choices, at the same points)
            if self.draft_and_send(tokens_wanted) and len(pipe) and tally.tokens < tokens_wanted:
                self.read()
        tally.tokens, tally.seconds, tally.cloud_s = min(tally.tokens, tokens_wanted), self.now, self.cloud.busy_s
        return tally
