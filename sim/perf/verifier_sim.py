"""The verifier's side of the block simulation (``sim.perf.block_sim``), on the same clock.

It answers pending blocks in order, one forward at a time, as
``cloud.session.VerifierSession.verify_chain_steps`` does: a usable block with
every later block of its chain already there in one forward (``forward_s`` of
the rows: the drafts and one more), or a stale block, with a token decoded for
it (``stale_decode_s``, after ``rebased_per_stale_decode`` rebased drafts on
average) where the verifier's own rule says so
(``cloud.next_block.decodes_stale`` against its ``NextBlockClock``; a chain
stands for an epoch), else at once, empty. The tokens a verified block commits
follow ``shared.verdict.token_follows``, the blocks one forward verifies
``cloud.pending_block.shares_forward``. A correction makes the chain's later
blocks stale; whether a block is usable is ``cloud.pending_block.usable``, its
inputs read off the chains: a chain's first block continues the committed
tokens unless a token decoded for a void block under its guesses was guessed
wrong (``token_guessed``); an empty one needs only its epoch.
"""

from __future__ import annotations

import math
import random
from collections import deque

from cloud.next_block import NextBlockClock, decodes_stale
from cloud.pending_block import shares_forward, usable
from shared.verdict import token_follows
from sim.perf.block_costs import BlockCosts, SimBlock

__all__ = ["VerifierSim"]


class VerifierSim:
    """The verifier's side of one generation."""

    def __init__(self, costs: BlockCosts, rng: random.Random, pending: deque[SimBlock]) -> None:
        self.costs, self.rng, self.pending = costs, rng, pending
        self.free_at = self.busy_s = 0.0
        self.chain, self.alive = 0, True  # the chain it verifies, until a correction ends it
        self.stale_decoded = 0  # tokens decoded for stale blocks since the last correction
        self.stale_decodes: list[SimBlock] = []  # ... the blocks they were decoded for
        self.next_block = NextBlockClock()  # the verifier's: a chain stands for an epoch

    def answers_before(self, head: SimBlock, at: float) -> bool:
        """Whether ``head``, the oldest block in flight, has its verdict before ``at`` (it is answered
        first where that can be: then it started before a block sent at ``at`` would be there)."""
        if head.verdict_at == math.inf:
            earliest = max(self.free_at, head.at_cloud) + self.costs.rtt_s / 2 + self.costs.down_s
            if earliest >= at:
                return False
            while head.verdict_at == math.inf:
                self.step()
        return head.verdict_at < at

    def _accepted(self, drafts: int) -> int:
        alpha = self.costs.alpha
        for i in range(drafts):
            if self.rng.random() >= alpha[min(i, len(alpha) - 1)]:
                return i
        return drafts

    def _stale_decode(self) -> int:
        """Tokens a stale block's forward commits: the one decoded, after the rebased drafts it accepts."""
        whole = int(self.costs.rebased_per_stale_decode)
        return 1 + whole + (self.rng.random() < self.costs.rebased_per_stale_decode - whole)

    def _usable(self, block: SimBlock) -> bool:
        """``cloud.pending_block.usable``, its inputs read off the model's chains (a chain stands for an
        epoch). A block of the live chain is of the epoch while no correction ended it, and continues it.
        A chain's first block opens the next epoch; its drafts continue the committed tokens unless a token
        decoded for a void block before the edge read its verdict moved the committed end from under it
        with a guess of it that was wrong (a token decoded for a stale block is a bonus, not a correction,
        so the epoch it was sent at still holds)."""
        current = block.chain == self.chain
        same_epoch = self.alive if current else block.opens_chain and block.chain > self.chain
        drafts_continue = current or not any(
            decode.mismatch and decode.verdict_at > block.sent_at for decode in self.stale_decodes)
        return usable(same_epoch=same_epoch, empty=block.empty, drafts_continue=drafts_continue)

    def step(self) -> None:
        """Answer the front of the pending blocks (one forward, or an empty stale verdict)."""
        costs, pending = self.costs, self.pending
        start = max(self.free_at, pending[0].at_cloud)
        there = [b for b in pending if b.at_cloud <= start]
        for block in there:
            self.next_block.arrived(block.at_cloud, block.chain)
        head = pending.popleft()
        if not self._usable(head):
            head.stale = True
            if not decodes_stale(enabled=costs.decode_stale, usable_behind=any(self._usable(b) for b in there[1:]),
                                 now=start, forward_s=costs.stale_decode_s, deadline=self.next_block.deadline(),
                                 may_overrun=costs.stale_decode_overruns, guess_odds=costs.alpha[0]):
                head.done_at, head.verdict_at = start, start + costs.rtt_s / 2 + costs.down_s
                return
            head.committed = self._stale_decode()
            head.mismatch = self.rng.random() >= costs.token_guessed
            self.stale_decoded += head.committed
            self.stale_decodes.append(head)
            self._ran(start, costs.stale_decode_s, [head], rows=1)
            return
        if head.chain != self.chain:  # a new chain: the tokens decoded under its guesses are skipped,
            head.drafts += max(head.guesses - self.stale_decoded, 0)  # its other guesses are drafts
            self.chain, self.alive, self.stale_decoded, self.stale_decodes = head.chain, True, 0, []
        batch = [head]  # with every later block of the chain there (the verifier's rule; a chain stands for an epoch)
        while pending and pending[0].at_cloud <= start and shares_forward(
                batch[-1].more_follows, batch[-1].start_position + batch[-1].size, self.chain,
                pending[0].start_position, pending[0].chain):
            batch.append(pending.popleft())
        for i, block in enumerate(batch):
            block.accepted = 0 if block.guess_wrong else self._accepted(block.drafts)
            block.committed = block.accepted + token_follows(block.accepted, block.drafts, block.more_follows)
            if block.accepted < block.drafts:  # a correction: the chain's later blocks are stale
                block.ends_chain, self.alive = True, False
                pending.extendleft(reversed(batch[i + 1:]))
                del batch[i + 1:]
                break
        rows = sum(b.drafts for b in batch) + 1
        self._ran(start, costs.forward_s(rows), batch, rows)
        if not self.alive:
            self.next_block.corrected(self.free_at, self.chain + 1)
            self.stale_decoded, self.stale_decodes = 0, []

    def _ran(self, start: float, seconds: float, answered: list[SimBlock], rows: int) -> None:
        self.free_at = start + seconds
        self.busy_s += seconds
        for block in answered:
            block.forward_s, block.forward_rows, block.done_at = seconds, rows, self.free_at
            block.verdict_at = self.free_at + self.costs.rtt_s / 2 + self.costs.down_s
