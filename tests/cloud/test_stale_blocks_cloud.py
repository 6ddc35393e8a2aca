"""Stale blocks, the cloud's side: a block past a correction, or one that does not continue the
committed tokens, is answered with a token decoded alone (a stale decode: only where the forward would not
delay the next block) and, where the session rebases, its drafts verified where they lie."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import numpy as np
import pytest
from helpers import GREEDY, TEXTS, new_session, tiny_prompt

from cloud.next_block import NextBlockClock, stale_decode_overrun_pays
from cloud.session import BlockRejected, PendingBlock, SessionPolicy, VerifierSession
from protos import splitspec_pb2 as pb
from shared import codec
from shared.params import Mode, SamplingParams
from shared.sparse import SparseDist
from shared.verdict import StopReason


def test_rejection_voids_later_blocks_answered_by_cloud_tokens(tiny_engine, greedy_path):
    """A rejection voids the blocks after it, which the cloud answers with tokens of its own."""
    prompt, want = greedy_path
    session = new_session(tiny_engine, prompt, rebase_stale=False)  # --stale-blocks decode
    p = len(prompt)
    wrong = (want[2] + 1) % tiny_engine.vocab_size
    pending = [PendingBlock(0, p, [want[0], want[1], wrong, want[3]], more_follows=True),
               PendingBlock(0, p + 4, want[4:8], more_follows=True)]
    verdicts = session.verify_chain(pending)
    assert [(v.accepted, v.token, v.is_correction) for v in verdicts] == [(2, want[2], True)]
    assert session.epoch == 1 and session.tokens[p:] == want[:3]
    assert len(pending) == 1  # the block after the correction stays pending: it is stale now
    # Nothing usable waits behind it: the cloud decodes the next token alone and answers the stale block with it.
    (filled,) = session.verify_chain(pending)
    assert (filled.stale, filled.epoch, filled.start_position, filled.token) == (True, 0, p + 3, want[3])
    assert not filled.is_correction and session.epoch == 1 and not pending
    # The edge drafted again from the correction; its first draft guesses the token decoded alone. A stale
    # block still ahead of it is answered without a forward (a usable block waits), then it is verified past
    # the guess it got right.
    forwards = session.forwards
    pending = [PendingBlock(0, p + 8, want[8:10]), PendingBlock(1, p + 3, want[3:8])]
    (dropped,) = session.verify_chain(pending)
    assert dropped.stale and dropped.token is None and session.forwards == forwards and len(pending) == 1
    (verified,) = session.verify_chain(pending)
    assert (verified.start_position, verified.accepted, verified.token) == (p + 4, 4, want[8])
    assert session.tokens[p:] == want[:9] and session.forwards == forwards + 1
    # A service that does not decode for stale blocks answers them empty, without a forward.
    session = VerifierSession(tiny_engine, prompt, GREEDY, max_new_tokens=64, max_draft_len=16,
                              policy=SessionPolicy(decode_stale=False))
    forwards = session.forwards
    (empty,) = session.verify_chain([PendingBlock(0, p + 8, want[8:10])])
    assert empty.stale and empty.token is None and session.forwards == forwards and session.tokens[p:] == []


def test_stale_forward_verifies_drafts_past_the_correction(tiny_engine, greedy_path, monkeypatch):
    """A stale block's forward verifies the drafts sent past the correction where they lie.

    The failing block's drafts past its correction and the stale blocks' drafts (drafted past a token
    the target did not pick) are verified at their positions in a stale block's forward; those accepted
    ride in its verdict before the token. No epoch changes: the edge's next chain is checked by content."""
    prompt, want = greedy_path
    session = new_session(tiny_engine, prompt)
    p = len(prompt)
    wrong, other = (want[2] + 1) % tiny_engine.vocab_size, (want[5] + 1) % tiny_engine.vocab_size
    pending = [PendingBlock(0, p, [want[0], want[1], wrong, want[3]], more_follows=True),
               PendingBlock(0, p + 4, [want[4], other, want[6], want[7]], more_follows=True),
               PendingBlock(0, p + 8, want[8:10])]
    (correction,) = session.verify_chain(pending)
    assert correction.is_correction and session.epoch == 1 and len(pending) == 2
    forwards = session.forwards
    # As many drafts as cost no more than the token alone: on a CPU, the rows its products are padded to
    # (the CPU's tile: 2 to 16 rows, ``cloud.invariance.probe.invariant_row_padding``); held at 4 here.
    assert tiny_engine.rows_at_cost_of(1) == tiny_engine.padding.tile >= 2
    monkeypatch.setattr(tiny_engine, "rows_at_cost_of", lambda rows, reproducible=False: 4)
    (first,) = session.verify_chain(pending)  # drafts from p + 3: want[3], want[4], other (, want[6], want[7])
    assert (first.stale, first.epoch, first.start_position, first.accepted) == (True, 0, p + 3, 0)
    verified = 3  # the spare drafts in a row (p + 3 .. p + 7), as the rows allow
    assert (first.rebased, first.token, first.rebased_verified) == ((want[3], want[4]), want[5], verified)
    assert first.committed([]) == want[3:6] and session.forwards == forwards + 1 and session.epoch == 1
    (second,) = session.verify_chain(pending)  # the drafts past that correction are spare still (p + 6 .. p + 9)
    n = 3
    assert (second.rebased, second.token) == (tuple(want[6 : 6 + n]), want[6 + n]) and not pending
    assert session.tokens[p:] == want[: 7 + n] and session.epoch == 1 and session.stats.rebased == 2 + n
    # --stale-blocks decode: the token alone.
    session = new_session(tiny_engine, prompt, rebase_stale=False)
    pending = [PendingBlock(0, p, [want[0], wrong, want[2]], more_follows=True), PendingBlock(0, p + 3, want[3:5])]
    session.verify_chain(pending)
    (alone,) = session.verify_chain(pending)
    assert (alone.rebased, alone.rebased_verified, alone.token) == ((), 0, want[2])


def test_rebased_drafts_stop_at_eos_and_the_token_limit(tiny_engine, greedy_path, monkeypatch):
    monkeypatch.setattr(tiny_engine, "rows_at_cost_of", lambda rows, reproducible=False: 4)  # (the CPU's tile: 2 to 16)
    prompt, want = greedy_path
    p = len(prompt)
    wrong = (want[0] + 1) % tiny_engine.vocab_size
    session = new_session(tiny_engine, prompt, max_new_tokens=4)
    pending = [PendingBlock(0, p, [wrong, want[1]], more_follows=True), PendingBlock(0, p + 2, want[2:6])]
    session.verify_chain(pending)
    (last,) = session.verify_chain(pending)
    assert (last.rebased, last.token, last.done, last.stop_reason) == (tuple(want[1:4]), None, True, StopReason.LENGTH)
    assert session.tokens[p:] == want[:4]
    session = new_session(tiny_engine, prompt)
    pending = [PendingBlock(0, p, [wrong, want[1]], more_follows=True), PendingBlock(0, p + 2, want[2:6])]
    session.verify_chain(pending)
    original = session.engine.eos_token_ids
    try:
        session.engine.eos_token_ids = {want[2]}  # the second rebased draft ends the text
        (last,) = session.verify_chain(pending)
    finally:
        session.engine.eos_token_ids = original
    assert (last.rebased, last.token, last.done, last.stop_reason) == (tuple(want[1:3]), None, True, StopReason.EOS)
    assert session.tokens[p:] == want[:3]


def test_a_block_that_does_not_continue_the_committed_tokens_is_stale(tiny_engine, greedy_path):
    prompt, want = greedy_path
    q = len(prompt) + 2  # the next position once two tokens are committed

    def two_committed() -> VerifierSession:
        session = new_session(tiny_engine, prompt)
        session.verify_chain([PendingBlock(0, len(prompt), [want[0]])])  # accepted, then the bonus
        assert len(session.tokens) == q
        return session

    wrong = (want[1] + 1) % tiny_engine.vocab_size
    for block in (
        PendingBlock(0, q - 1, [wrong, want[2], want[3]]),  # its guess for a committed token is wrong
        PendingBlock(0, q + 2, want[4:7]),  # it starts past the next position (chained on drafts not verified)
        PendingBlock(0, q - 2, want[:2]),  # every draft is committed already: nothing to verify
    ):
        session = two_committed()
        (verdict,) = session.verify_chain([block])
        assert (verdict.stale, verdict.start_position, verdict.committed([])[0]) == (True, q, want[2]), block
    session = two_committed()  # an empty block asks for the next token, wherever the edge thought that was
    (verdict,) = session.verify_chain([PendingBlock(0, q + 5, [])])  # (tokens decoded alone came first)
    assert not verdict.stale and (verdict.start_position, verdict.token) == (q, want[2])
    session = two_committed()  # right guesses for the committed tokens: verified past them
    (verdict,) = session.verify_chain([PendingBlock(0, q - 2, want[:5])])
    assert not verdict.stale and (verdict.start_position, verdict.accepted, verdict.token) == (q, 3, want[5])
    with pytest.raises(BlockRejected, match="outside the session's"):  # no honest edge drafts inside the prompt
        two_committed().verify_chain([PendingBlock(0, len(prompt) - 1, [prompt[-1], *want[:3]])])


def test_skipped_drafts_leave_the_same_verification_in_rejection_mode(tiny_engine, drafters):
    """A block whose first drafts the committed tokens hold is verified exactly as the block without
    them would be: its q̃ are cut with its drafts (rejection mode's acceptance reads them)."""
    prompt = tiny_prompt(tiny_engine, TEXTS[1])
    drafter = drafters["drafter_noisy"]
    for seed in range(6):
        params = SamplingParams(mode=Mode.REJECTION, temperature=1.0, top_k=8, seed=seed)
        drafter.begin(prompt, params)
        block = drafter.draft(5)
        twins = [VerifierSession(tiny_engine, prompt, params, max_new_tokens=32, max_draft_len=8) for _ in range(2)]
        for session in twins:  # the first two tokens decoded alone
            session.verify_chain([PendingBlock(0, len(prompt), [])])
            session.verify_chain([PendingBlock(0, len(prompt) + 1, [])])
        committed = twins[0].tokens[len(prompt):]
        guessed = [*committed, *block.tokens[2:]]  # guesses right for the two committed positions
        whole = twins[0].verify_chain([PendingBlock(0, len(prompt), guessed, block.q)])
        cut = twins[1].verify_chain([PendingBlock(0, len(prompt) + 2, block.tokens[2:], block.q[2:])])
        assert whole == cut and twins[0].tokens == twins[1].tokens
    drafter.rewind()


def test_a_deferred_bonus_then_a_stale_block_and_a_skip(tiny_engine, greedy_path):
    """After a chain deferred its bonus, a stale block's token comes from the kept row (no forward),
    and the next block is verified past its guess for it."""
    prompt, want = greedy_path
    session = new_session(tiny_engine, prompt)
    p = len(prompt)
    (deferred,) = session.verify_chain([PendingBlock(0, p, want[:3], more_follows=True)])
    assert deferred.is_deferred and session.tokens[p:] == want[:3]
    forwards = session.forwards
    (filled,) = session.verify_chain([PendingBlock(0, p + 9, want[9:11])])  # stale: past the next position
    assert filled.stale and filled.token == want[3] and session.forwards == forwards
    (verified,) = session.verify_chain([PendingBlock(0, p + 3, want[3:7])])
    assert (verified.start_position, verified.accepted, verified.token) == (p + 4, 3, want[7])
    assert session.tokens[p:] == want[:8]


def test_no_stale_decode_when_its_forward_would_delay_the_next_block(tiny_engine, greedy_path):
    """A stale block gets no stale decode when the forward would delay the next block.

    The caller's stale-decode deadline (when the edge's next block is expected): a token decoded alone
    whose forward would still run then is not started, since the block would wait for it."""
    prompt, want = greedy_path
    p = len(prompt)
    wrong = (want[0] + 1) % tiny_engine.vocab_size

    def corrected() -> tuple[VerifierSession, list[PendingBlock]]:
        session = new_session(tiny_engine, prompt, rebase_stale=False)
        pending = [PendingBlock(0, p, [wrong, want[1]], more_follows=True), PendingBlock(0, p + 2, want[2:4])]
        (correction,) = session.verify_chain(pending)
        assert correction.is_correction and len(pending) == 1
        return session, pending

    session, pending = corrected()
    forwards = session.forwards
    (empty,) = session.verify_chain(pending, stale_decode_deadline=time.perf_counter() - 1.0)  # the block is due now
    assert empty.stale and empty.token is None and session.forwards == forwards and session.tokens[p:] == want[:1]
    session, pending = corrected()
    (filled,) = session.verify_chain(pending, stale_decode_deadline=time.perf_counter() + 60.0)  # time for a forward
    assert filled.stale and filled.token == want[1] and session.forwards == forwards + 1
    assert session.one_token_s.value > 0  # what the next deadline is weighed against
    # After a deferred bonus the token decoded alone needs no forward: decoded whatever the deadline.
    session = new_session(tiny_engine, prompt)
    session.verify_chain([PendingBlock(0, p, want[:3], more_follows=True)])
    (filled,) = session.verify_chain([PendingBlock(0, p + 9, want[9:11])], stale_decode_deadline=time.perf_counter() - 1.0)
    assert filled.stale and filled.token == want[3]


@pytest.mark.parametrize("mode", [Mode.GREEDY, Mode.REJECTION])
def test_stale_decode_overruns_the_deadline_only_where_guesses_seldom_hold(tiny_engine, greedy_path, mode):
    """A stale decode runs past the deadline only where the edge's guesses seldom hold.

    A stale decode that would end half-way between the next block's due time and its own length later
    (overrun = the time still ahead) pays when the edge's guess of its token holds less than half
    the time, in greedy and coupled modes: there the guess is verified against that same token.
    Rejection mode samples it apart: never past the deadline."""
    prompt, want = greedy_path
    p = len(prompt)
    wrong = (want[0] + 1) % tiny_engine.vocab_size
    # (rejection mode, nearly greedy: the point-mass draft ``wrong`` is rejected, and the correction is want[0])
    params = GREEDY if mode is Mode.GREEDY else SamplingParams(Mode.REJECTION, temperature=0.05, seed=3)

    def corrected(first_drafts_held: int) -> tuple[VerifierSession, list[PendingBlock]]:
        """A session whose blocks' first drafts held ``first_drafts_held`` times before a first draft
        failed, with a block in flight past that correction."""
        session = new_session(tiny_engine, prompt, rebase_stale=False, params=params)
        session.stats.drafted_at, session.stats.accepted_at = [first_drafts_held], [first_drafts_held]
        pending = [PendingBlock(0, p, [wrong, want[1]], more_follows=True), PendingBlock(0, p + 2, want[2:4])]
        if mode is Mode.REJECTION:
            pending = [replace(b, q=[SparseDist(np.array([t]), np.array([256]), 8) for t in b.drafts]) for b in pending]
        (correction,) = session.verify_chain(pending)
        assert correction.is_correction and len(pending) == 1
        session.one_token_s.value = 20.0  # the forward, as measured: the deadline lies half-way through it
        return session, pending

    for held, fills in ((0, mode is Mode.GREEDY), (9, False)):  # odds (held + 1) / (held + 1 + 2): 1/3, 5/6
        session, pending = corrected(held)
        forwards = session.forwards
        (verdict,) = session.verify_chain(pending, stale_decode_deadline=time.perf_counter() + 10.0)
        assert verdict.stale and (verdict.token is not None) == fills and session.forwards == forwards + fills
    assert stale_decode_overrun_pays(1.0, 1.0, 0.49) and not stale_decode_overrun_pays(1.0, 1.0, 0.5)
    assert not stale_decode_overrun_pays(0.1, 0.0, 0.0)  # the block is due already: nothing is learned earlier
    assert stale_decode_overrun_pays(5.0, 0.1, 0.0)  # the guesses never hold: any head start pays


def test_the_next_block_is_expected_one_measured_gap_after_a_correction():
    """The servicer's clock for the stale-decode deadline: no deadline before a gap was measured or once the
    block came; a block of an older epoch (stale) is no sample, the first of the correction's epoch or a
    later one (the edge's chains may skip one) is; the gap is a moving average."""
    clock = NextBlockClock()
    assert clock.deadline() is None
    clock.corrected(10.0, epoch=1)
    assert clock.deadline() is None  # nothing measured yet: decode
    clock.arrived(10.1, epoch=0)  # a stale block still in flight: not the next chain's
    assert clock.gap_s.value is None and clock.deadline() is None
    clock.arrived(10.3, epoch=2)  # a later epoch than the correction's: the sample
    assert clock.gap_s.value == pytest.approx(0.3) and clock.deadline() is None  # it came
    clock.corrected(20.0, epoch=2)
    assert clock.deadline() == pytest.approx(20.3)
    clock.arrived(20.8, epoch=2)
    assert clock.gap_s.value == pytest.approx(0.8 * 0.3 + 0.2 * 0.8) and clock.deadline() is None


def test_a_stale_blocks_ids_are_decoded_only_for_a_session_that_rebases(tiny_engine, greedy_path):
    from cloud.limits import ServiceLimits
    from cloud.servicer import VerifierServicer
    from shared.wire import OpenRequest

    prompt, want = greedy_path
    servicer = VerifierServicer(tiny_engine, ServiceLimits())
    payload = codec.encode_tokens(want[4:6], tiny_engine.vocab_size).data

    async def stale_block(takes_rebased: bool, mode: Mode) -> PendingBlock:
        params = SamplingParams(mode=mode, temperature=1.0, seed=0)
        entry = await servicer.handshake.new_session(OpenRequest(params, prompt, 40), 8, "test",
                                                     pb.Open(takes_rebased=takes_rebased))
        try:
            entry.session.epoch = 1  # as after a correction
            return servicer.blocks.decode_draft(entry, pb.Draft(epoch=0, start_position=len(prompt) + 4, payload=payload))
        finally:
            servicer.table.remove(entry)

    assert asyncio.run(stale_block(True, Mode.COUPLED)).drafts == want[4:6]
    assert asyncio.run(stale_block(False, Mode.COUPLED)).drafts == []  # an edge from before rebasing
    assert asyncio.run(stale_block(True, Mode.REJECTION)).drafts == []  # (q̃ is never decoded for a stale block)
    servicer.scheduler.shutdown()
