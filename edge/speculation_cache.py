"""The speculation cache: a correction's next block, drafted before the verdict that asks for it.

A correction voids every block in flight behind it, and the next chain's first
block used to leave only after the verdict had landed and a whole block had
been drafted (``DecodeStats.restart_draft_s``: 12% and 9% of the wall time
with the default and q2_k drafters on acespec-50k, 2026-12-06-categories-epyc).
The cache bets on the correction instead, as SSD does (Kumar, Dao and May,
"Speculative Speculative Decoding", arXiv 2603.03251): at the draft where the
oldest live block in flight most likely first fails (``edge.hedging.first_failure``,
read from the drafts' margins), the drafter's runner-up (in coupled mode the
second place of the same race the target runs) and the drafts after it. When
the verdict corrects there to that token, the committed tokens are exactly the
sequence the branch was drafted on, and the branch is the next block's
drafts: it leaves as the verdict lands.

When a branch is drafted (``SpeculationCache.bet``, ``SpeculationCache.pays``):
while the edge would otherwise wait for a verdict (the window is full), always;
before a deeper block of the chain, only when the branch is likelier to be
used: P(the block bet on fails) · P(first at the bet | it fails) · h > P(every
live block in flight is accepted whole), the first and last from the session's
counts (``DecodeStats.accepted_at``), the share from the drafts' margins, h the
correction hit rate measured so far (``DecodeStats.corrections_hit``), since
either costs the same drafting and saves about as much when it is used.
Drafting a branch stops when a verdict arrives, as a block's does. A model
drafter drafts it on a KV sequence of its own (``edge.llama_drafter``), so the
speculation is not read again after it.

Lossless by construction: a branch is only ever sent as drafts, which the
verifier checks as any others, and it is taken only where the committed tokens
equal the sequence it was drafted on, token for token. Greedy and coupled modes
only (a rejection-mode draft carries its q̃, and a runner-up is not a bet there).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from edge.drafter import DraftBlock, Drafter
from edge.hedging import first_failure
from edge.in_flight import Drafting, InFlight
from shared.stats import DecodeStats

__all__ = ["Bet", "Branch", "SpeculationCache"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Bet:
    """Where the oldest live block's first failure is likeliest, and the correction guessed there."""

    block: InFlight  # the block bet on
    index: int  # its draft the bet replaces
    token: int  # the guessed correction (the drafter's runner-up there)
    share: float  # of the block's failures, the share whose first rejection is at ``index`` (from its margins)


@dataclass(frozen=True)
class Branch:
    """Drafts continuing ``base``, drafted before the verdict that may commit it."""

    base: tuple[int, ...]  # the sequence drafted on: the committed tokens, the block's drafts before the bet, the bet
    block: DraftBlock  # the drafts after it
    draft_s: float  # what drafting them took


class SpeculationCache:
    """A session's restarts after corrections: whether one is pending, and, where ``enabled``, at most
    one branch drafted for the next, on the oldest live block in flight (see the module docstring)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.restarting = False  # a correction ended a chain: the next block sent begins the next one
        self.branch: Branch | None = None
        self._bet_on: tuple[int, int] | None = None  # (epoch, start) of the block the last bet was on

    def bet(self, live: Sequence[InFlight], committed_end: int) -> Bet | None:
        """The bet for the oldest of the ``live`` blocks in flight, where it has not had one yet and its
        drafts carry runner-ups (greedy and coupled modes, a model drafter's); ``committed_end``: the
        position after the committed tokens (drafts before it were guesses that came true: no bet)."""
        if not self.enabled or not live:
            return None
        oldest = live[0]
        block = oldest.block
        if (oldest.epoch, oldest.start_position) == self._bet_on or not block.runner_up or block.q is not None:
            return None
        failure = first_failure(block.margins or [None] * len(block.tokens))
        first = max(committed_end - oldest.start_position, 0)
        candidates = [i for i, guess in enumerate(block.runner_up) if guess is not None and i >= first]
        if not candidates:
            return None
        index = max(candidates, key=lambda i: (failure[i], -i))
        return Bet(oldest, index, block.runner_up[index], failure[index] / max(sum(failure[first:]), 1e-12))

    @staticmethod
    def pays(bet: Bet, live: Sequence[InFlight], stats: DecodeStats) -> bool:
        """Whether the branch should be drafted before the chain's next block: it is likelier to be used
        than that block. The branch is used when the block bet on fails (the session's odds of a block
        of its length being accepted whole, ``DecodeStats.accepted_at``), first at the bet (its
        ``share``), with the drafter's runner-up as the correction (the hit rate measured); the next block
        when every ``live`` block is accepted whole. (Each count has one success and one failure added
        before any.)"""
        hit_rate = (stats.corrections_hit + 1) / (stats.corrections_guessed + 2)

        def whole(flight: InFlight) -> float:
            i = min(len(flight.block.tokens), len(stats.drafted_at)) - 1
            return 0.5 if i < 0 else (stats.accepted_at[i] + 1) / (stats.drafted_at[i] + 2)

        return (1.0 - whole(bet.block)) * bet.share * hit_rate > math.prod(whole(flight) for flight in live)

    def fill(self, drafter: Drafter, bet: Bet, drafts: int, stop: Callable[[], bool]) -> bool:
        """Draft up to ``drafts`` drafts after the bet (fewer when ``stop`` answers True), replacing the
        branch held; False when the drafter's speculation does not hold the block bet on."""
        self._bet_on = (bet.block.epoch, bet.block.start_position)
        sequence = drafter.sequence
        at = bet.block.start_position + bet.index
        if sequence[bet.block.start_position:at + 1] != bet.block.block.tokens[:bet.index + 1]:
            return False
        started = time.perf_counter()
        block = drafter.draft_branch(len(sequence) - at, bet.token, drafts, stop)
        self.branch = Branch((*sequence[:at], bet.token), block, time.perf_counter() - started)
        return True

    def draft(self, drafter: Drafter, bet: Bet, live: Sequence[InFlight], drafts: int, *, idle: bool,
              stop: Callable[[], bool], stats: DecodeStats) -> bool:
        """Draft ``bet``'s branch (on the oldest of the ``live`` blocks in flight), up to ``drafts`` drafts
        (``fill``), when the drafter is ``idle`` (nothing more may go), or else, before the chain's next
        block, where the branch is likelier to be used (``pays``, on what ``stats`` has measured); True
        when a branch was drafted (``stats`` records it)."""
        if not (idle or self.pays(bet, live, stats)):
            return False
        began = time.perf_counter()
        if not self.fill(drafter, bet, drafts, stop):
            return False
        stats.record_cache_branch(time.perf_counter() - began)
        log.debug("branch @%d: %d drafts after the bet %d (%s)", bet.block.start_position + bet.index + 1,
                  len(self.branch.block.tokens), bet.token, "idle" if idle else "before the next block")
        return True

    def seed(self, drafting: Drafting, committed: Sequence[int], drafter: Drafter, stats: DecodeStats) -> Drafting:
        """``drafting``, a chain's first block after the ``committed`` tokens, begun with the branch drafted
        on exactly those tokens, where there is one and the drafter's speculation is empty (its drafts join
        the speculation; ``stats`` records the hit); else as it was."""
        if self.branch is None or len(drafter.sequence) != len(committed):  # (none held: the drafter is not asked)
            return drafting
        branch = self.take(committed, drafting.drafts)
        if branch is None:
            return drafting
        drafter.speculate(branch.block.tokens)
        stats.record_cache_hit(len(branch.block.tokens), branch.draft_s)
        log.debug("block @%d: %d drafts from the speculation cache", drafting.start, len(branch.block.tokens))
        return replace(drafting.grown(branch.block, branch.draft_s), cached_s=branch.draft_s)

    def take(self, committed: Sequence[int], drafts: int) -> Branch | None:
        """The branch drafted on exactly the ``committed`` tokens (then it is no longer held), its first
        ``drafts`` drafts at most; else None."""
        branch = self.branch
        if (branch is None or not branch.block.tokens or len(committed) != len(branch.base)
                or tuple(committed) != branch.base):
            return None
        self.branch = None
        return branch if len(branch.block.tokens) <= drafts else replace(branch, block=branch.block.first(drafts))

