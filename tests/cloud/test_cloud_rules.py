"""The cloud's protocol rules as pure functions, table-driven: the stale-decode decision, the next-block
clock, which blocks share a forward, drafts per block, spare drafts, the tokens a verdict commits and
where a generation ends. The
verifier (``cloud.session``) and the performance model (``sim.perf.verifier_sim``) both decide by
these; the last tests drive each with the same case."""

from __future__ import annotations

import random
from collections import deque

import pytest
from helpers import GREEDY, new_session

from cloud.draft_limit import DraftLimit
from cloud.next_block import decodes_stale
from cloud.pending_block import shares_forward, usable
from cloud.session import PendingBlock
from cloud.spare_drafts import MAX_FREE_DRAFTS, SpareDrafts, free_drafts
from cloud.step_result import StepResult
from shared.verdict import StopReason, Verdict, end_within, token_follows
from sim.perf.block_costs import BlockCosts, SimBlock
from sim.perf.verifier_sim import VerifierSim

# (enabled, usable_behind, now, forward_s, deadline, may_overrun, guess_odds) -> decodes
STALE_DECODE_CASES = [
    ((False, False, 0.0, 0.1, None, True, 0.5), False),  # the service drops stale blocks
    ((True, True, 0.0, 0.1, None, True, 0.5), False),  # a usable block waits behind: it goes first
    ((True, False, 0.0, 0.1, None, True, 0.5), True),  # no deadline: decode
    ((True, False, 0.0, 0.1, 0.2, True, 0.5), True),  # over by the deadline
    ((True, False, 0.0, 0.1, 0.1, True, 0.5), True),  # ... exactly at it
    ((True, False, 0.0, 0.3, 0.1, False, 0.0), False),  # overruns, and may not (rejection mode)
    ((True, False, 0.0, 0.3, 0.1, True, 0.9), False),  # overruns 0.2 s; guesses hold: 0.1 * 0.1 < 0.9 * 0.2
    ((True, False, 0.0, 0.3, 0.1, True, 0.0), True),  # overruns; guesses never hold: any head start pays
    ((True, False, 0.5, 0.3, 0.1, True, 0.0), False),  # the block is due already: nothing is learned earlier
]


@pytest.mark.parametrize(("case", "decodes"), STALE_DECODE_CASES)
def test_the_stale_decode_decision(case, decodes):
    enabled, usable_behind, now, forward_s, deadline, may_overrun, guess_odds = case
    assert decodes_stale(enabled=enabled, usable_behind=usable_behind, now=now, forward_s=forward_s,
                         deadline=deadline, may_overrun=may_overrun, guess_odds=guess_odds) is decodes


@pytest.mark.parametrize(("accepted", "drafts", "more_follows", "follows"), [
    (0, 0, False, True),  # an empty block: the next token
    (2, 4, False, True),  # a correction
    (2, 4, True, True),  # a correction inside a chain
    (4, 4, False, True),  # a bonus
    (4, 4, True, False),  # every draft accepted, more follow: the bonus is deferred
])
def test_a_verified_block_commits_a_token_after_its_drafts_unless_its_bonus_is_deferred(accepted, drafts,
                                                                                     more_follows, follows):
    assert token_follows(accepted, drafts, more_follows) is follows


@pytest.mark.parametrize(("tokens", "room", "end"), [
    ([5, 6, 7], 10, (3, StopReason.NONE)),
    ([5, 0, 7], 10, (2, StopReason.EOS)),  # the EOS is kept
    ([5, 6, 7], 2, (2, StopReason.LENGTH)),
    ([0, 6, 7], 1, (1, StopReason.EOS)),  # an EOS at the limit is an EOS
    ([], 3, (0, StopReason.NONE)),
])
def test_where_a_generation_ends_inside_a_block(tokens, room, end):
    assert end_within(tokens, {0}, room) == end


@pytest.mark.parametrize(("verdict", "count"), [
    (Verdict(0, 10, 3, 42, False, False), 4),  # three accepted and a correction
    (Verdict(0, 10, 3, None, False, False), 3),  # deferred bonus
    (Verdict(0, 10, 1, 42, False, False, branch=2, branch_accepted=2), 5),  # 1 + the branch's 1 + 2, the token
    (Verdict(0, 10, 0, 42, True, False, stale=True, rebased=(7, 8)), 3),  # a stale decode after two rebased
    (Verdict(0, 10, 0, None, False, False, stale=True), 0),  # answered empty
])
def test_the_tokens_a_verdict_commits(verdict, count):
    assert verdict.committed_count == count
    drafts = [1, 2, 3, 4]
    branches = ((0, [9]), (1, [11, 12, 13, 14]))
    assert len(verdict.committed(drafts if not verdict.stale else [], branches)) == count


@pytest.mark.parametrize(("previous_more_follows", "previous_end", "block_start", "block_epoch", "shares"), [
    (True, 14, 14, 2, True),  # the chain goes on
    (False, 14, 14, 2, False),  # the block before asked for a bonus: this one is verified on its own
    (True, 14, 15, 2, False),  # not where the chain ends
    (True, 14, 14, 1, False),  # an older epoch: stale
])
def test_which_pending_blocks_share_a_forward(previous_more_follows, previous_end, block_start, block_epoch, shares):
    assert shares_forward(previous_more_follows, previous_end, 2, block_start, block_epoch) is shares


def test_a_step_charges_its_client_neither_the_cloud_s_proposals_nor_what_they_commit():
    verdict = Verdict(0, 10, 0, 42, True, False, rebased=(7, 8))
    step = StepResult([verdict], rows=4, proposed=3, proposals_taken=2, seconds=0.1)
    assert (step.client_rows, step.client_tokens) == (1, 1)


def test_a_lowered_draft_limit_holds_later_epochs_only_and_outlives_a_new_turn():
    limit = DraftLimit(8)
    assert limit.current == 8 and limit.for_epoch(0) == 8
    assert limit.lower(3, epoch=2) and not limit.lower(5, epoch=3) and not limit.lower(0, epoch=3)
    assert (limit.current, limit.for_epoch(2), limit.for_epoch(3)) == (3, 8, 3)
    limit.reopen(6)  # a new turn asks again: the lowering stays, from its first epoch
    assert (limit.current, limit.opened, limit.for_epoch(0), limit.for_epoch(9)) == (3, 6, 3, 3)
    limit.reopen(2)  # a turn that asks for less than the lowering: its own limit
    assert (limit.current, limit.lowered, limit.for_epoch(0)) == (2, 0, 2)


def test_tokens_decoded_ahead_leave_a_forward_what_the_open_allows_beside_them():
    limit = DraftLimit(8)
    assert [limit.beside(held) for held in (0, 3, 8)] == [8, 5, 0]
    limit.lower(6, epoch=0)  # the lowered limit holds where the Open's less the held allows more
    assert [limit.beside(held) for held in (0, 3)] == [6, 5]


def test_spare_drafts_ride_where_they_lie_in_a_row():
    spare = SpareDrafts()
    spare.add(10, [1, 2, 3])
    spare.add(14, [5])  # position 13 is missing: the run stops there
    assert spare.run_from(11, most=8) == [2, 3]
    assert spare.run_from(10, most=8) == []  # forgotten: the committed tokens hold position 10 now
    spare.replace({13: 4})
    assert spare.run_from(12, most=8) == [] and spare.run_from(13, most=1) == [4]
    assert free_drafts(None, 16) == MAX_FREE_DRAFTS and free_drafts(4, 16) == 3 and free_drafts(4, 2) == 2


# -- the same rules driven by the verifier and by its model --------------------------------------------


def test_the_verifier_and_its_model_commit_the_same_tokens_for_a_chain(tiny_engine, greedy_path):
    """Two blocks of two right drafts in one chain, then one with a wrong second draft: the verifier
    verifies the chain in one forward (2, 2 deferred, then 1 and a correction), and so does the model."""
    prompt, want = greedy_path
    session = new_session(tiny_engine, prompt, params=GREEDY)
    start = len(prompt) + 1
    session.verify(0, len(prompt), [])  # the first position (answered from the prefill's row)
    wrong = (want[5] + 1) % tiny_engine.vocab_size
    pending = [PendingBlock(0, start, want[1:3], more_follows=True), PendingBlock(0, start + 2, want[3:5], more_follows=True),
               PendingBlock(0, start + 4, [want[5], wrong])]
    forwards = session.forwards
    product = [v.committed_count for v in session.verify_chain(pending)]
    assert session.forwards == forwards + 1

    costs = BlockCosts(alpha=[1.0], draft_s=0.01, up_s=lambda n: 0.0, rtt_s=0.0, down_s=0.0,
                       forward_s=lambda rows: 0.1, stale_decode_s=0.05, token_guessed=1.0)
    blocks = [SimBlock(1, 2, 0, i == 0, more_follows=i < 2, sent_at=0.0, at_cloud=0.0, start_position=2 * i, size=2)
              for i in range(3)]
    sim = VerifierSim(costs, _Scripted([1, 1, 1, 1, 1, 0]), deque(blocks))
    _answer_all(sim)
    assert sim.busy_s == pytest.approx(0.1)  # one forward
    assert product == [block.committed for block in blocks] == [2, 2, 2] and blocks[-1].ends_chain


def test_the_model_decodes_a_stale_block_only_as_the_verifier_s_rule_allows():
    """After a correction, a stale block with nothing usable behind it gets a token (no deadline yet);
    with ``decode_stale`` off it is answered empty, without a forward."""
    for decode_stale, committed, busy in ((True, 1, 0.15), (False, 0, 0.1)):
        costs = BlockCosts(alpha=[0.0], draft_s=0.01, up_s=lambda n: 0.0, rtt_s=0.0, down_s=0.0,
                           forward_s=lambda rows: 0.1, stale_decode_s=0.05, decode_stale=decode_stale,
                           token_guessed=1.0)
        first, second = blocks = [SimBlock(1, 1, 0, i == 0, more_follows=False, sent_at=0.0, at_cloud=0.0,
                                           start_position=i, size=1) for i in range(2)]
        sim = VerifierSim(costs, random.Random(0), deque(blocks))
        _answer_all(sim)
        assert first.ends_chain and second.stale and second.committed == committed
        assert sim.busy_s == pytest.approx(busy)


class _Scripted(random.Random):
    """Acceptance draws from a script: 1 accepts a draft, 0 rejects it."""

    def __init__(self, outcomes: list[int]) -> None:
        super().__init__(0)
        self.outcomes = list(outcomes)

    def random(self) -> float:
        return 0.0 if self.outcomes.pop(0) else 1.0


def _answer_all(sim: VerifierSim) -> None:
    while sim.pending:
        sim.step()


@pytest.mark.parametrize(("same_epoch", "empty", "drafts_continue", "want"), [
    (True, False, True, True),  # drafts that continue the committed tokens, this epoch: verified
    (True, False, False, False),  # drafts past a token they did not guess: stale
    (True, True, False, True),  # empty: it asks for the next token wherever that is
    (False, True, True, False),  # an older epoch: stale, empty or not
    (False, False, True, False),
])
def test_which_blocks_are_usable(same_epoch, empty, drafts_continue, want):
    assert usable(same_epoch=same_epoch, empty=empty, drafts_continue=drafts_continue) is want
