"""Blocks in flight: a chain of blocks verified in one forward, deferred bonuses, stale blocks,
and token identity with target-only decoding under every window (in process and over gRPC)."""

from __future__ import annotations

import asyncio
import itertools
import queue
import time
from collections import Counter, deque
from dataclasses import replace

import grpc
import numpy as np
import pytest
from helpers import ScriptedDrafter, exact_distribution, greedy_continuation, tiny_prompt, total_variation

from cloud.next_block import NextBlockClock, fill_overrun_pays
from cloud.session import BlockRejected, PendingBlock, VerifierSession
from edge.client import GrpcVerifier, VerifierError
from edge.controller import Controller
from edge.decode_loop import ProtocolError, run_decode
from edge.drafter import DraftBlock
from edge.llama_drafter import LlamaDrafter
from edge.ngram_drafter import NgramDrafter
from protos import splitspec_pb2 as pb
from protos import splitspec_pb2_grpc as pb_grpc
from shared import codec
from shared.params import Mode, SamplingParams
from shared.sparse import SparseDist
from shared.verdict import StopReason, Verdict
from shared.wire import sampling_to_proto
from sim.inprocess import LocalVerifier, generate

GREEDY = SamplingParams(mode=Mode.GREEDY)
TEXTS = ["The cat sat on the mat.", "We have 3 dogs and 12 cats!"]


@pytest.fixture(scope="module")
def drafters(tiny_models, tiny_engine):
    made = {
        name: LlamaDrafter(tiny_models[name], n_ctx=512, n_threads=1, f32_kv_cache=True)
        for name in ("drafter_f32", "drafter_noisy")
    }
    made["ngram"] = NgramDrafter(tiny_engine.vocab_size)
    yield made
    for drafter in made.values():
        drafter.close()


@pytest.fixture(scope="module")
def greedy_path(tiny_engine):
    """A prompt and the target's own greedy continuation of it (40 tokens)."""
    prompt = tiny_prompt(tiny_engine, TEXTS[0])
    return prompt, greedy_continuation(tiny_engine, prompt)


class CountingController(Controller):
    """Counts what the loop reports: acceptance (every drafted block's, and the early block's) and blocks."""

    acceptances = blocks = 0

    def observe_acceptance(self, drafted, accepted, first=0):
        self.acceptances += 1
        super().observe_acceptance(drafted, accepted, first)

    def observe_block(self, *args, **kwargs):
        self.blocks += 1
        super().observe_block(*args, **kwargs)


def new_session(engine, prompt, max_new_tokens=64, params=GREEDY, **kwargs):
    return VerifierSession(engine, prompt, params, max_new_tokens=max_new_tokens, max_draft_len=16, **kwargs)


# ---------------------------------------------------------------- the session's chains


def test_a_chain_of_accepted_blocks_defers_each_bonus_and_shares_one_forward(tiny_engine, greedy_path):
    prompt, want = greedy_path
    session = new_session(tiny_engine, prompt)
    before = session.forwards
    p = len(prompt)
    pending = [PendingBlock(0, p, want[0:4], more_follows=True), PendingBlock(0, p + 4, want[4:7], more_follows=True),
               PendingBlock(0, p + 7, want[7:9], more_follows=False)]
    verdicts = session.verify_chain(pending)
    assert [(v.accepted, v.token, v.bonus) for v in verdicts] == [(4, None, False), (3, None, False), (2, want[9], True)]
    assert [v.is_deferred for v in verdicts] == [True, True, False]
    assert session.forwards == before + 1 and not pending
    assert session.tokens[p:] == want[:10] and session.epoch == 0


def test_a_deferred_bonus_is_answered_by_an_empty_block_without_a_forward(tiny_engine, greedy_path):
    prompt, want = greedy_path
    session = new_session(tiny_engine, prompt)
    p = len(prompt)
    (deferred,) = session.verify_chain([PendingBlock(0, p, want[:5], more_follows=True)])
    assert deferred.is_deferred
    forwards = session.forwards
    (bonus,) = session.verify_chain([PendingBlock(0, p + 5, [])])
    assert (bonus.accepted, bonus.token, bonus.bonus) == (0, want[5], True)
    assert session.forwards == forwards  # the deferred row answered it
    (next_round,) = session.verify_chain([PendingBlock(0, p + 6, want[6:9])])
    assert next_round.token == want[9] and session.tokens[p:] == want[:10]


def test_a_rejection_voids_the_blocks_after_it_which_the_cloud_answers_with_tokens_of_its_own(tiny_engine, greedy_path):
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
    session = VerifierSession(tiny_engine, prompt, GREEDY, max_new_tokens=64, max_draft_len=16, decode_stale=False)
    forwards = session.forwards
    (empty,) = session.verify_chain([PendingBlock(0, p + 8, want[8:10])])
    assert empty.stale and empty.token is None and session.forwards == forwards and session.tokens[p:] == []


def test_a_stale_blocks_forward_verifies_the_drafts_sent_past_the_correction_where_they_lie(tiny_engine, greedy_path):
    """The failing block's drafts past its correction and the stale blocks' drafts (drafted past a token
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
    # (the CPU's tile: 4 or 16 rows, ``cloud.engine.invariant_row_padding``); three at least here.
    assert tiny_engine.rows_at_cost_of(1) == tiny_engine.padding.tile >= 4
    (first,) = session.verify_chain(pending)  # drafts from p + 3: want[3], want[4], other (, want[6], want[7])
    assert (first.stale, first.epoch, first.start_position, first.accepted) == (True, 0, p + 3, 0)
    verified = min(5, tiny_engine.padding.tile - 1)  # the spare drafts in a row (p + 3 .. p + 7), as the rows allow
    assert (first.rebased, first.token, first.rebased_verified) == ((want[3], want[4]), want[5], verified)
    assert first.committed([]) == want[3:6] and session.forwards == forwards + 1 and session.epoch == 1
    (second,) = session.verify_chain(pending)  # the drafts past that correction are spare still (p + 6 .. p + 9)
    n = min(4, tiny_engine.padding.tile - 1)
    assert (second.rebased, second.token) == (tuple(want[6 : 6 + n]), want[6 + n]) and not pending
    assert session.tokens[p:] == want[: 7 + n] and session.epoch == 1 and session.stats.rebased == 2 + n
    # --stale-blocks decode: the token alone.
    session = new_session(tiny_engine, prompt, rebase_stale=False)
    pending = [PendingBlock(0, p, [want[0], wrong, want[2]], more_follows=True), PendingBlock(0, p + 3, want[3:5])]
    session.verify_chain(pending)
    (alone,) = session.verify_chain(pending)
    assert (alone.rebased, alone.rebased_verified, alone.token) == ((), 0, want[2])


def test_rebased_drafts_stop_at_eos_and_the_token_limit(tiny_engine, greedy_path):
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


def test_a_stale_block_is_not_filled_when_the_forward_would_delay_the_next_block(tiny_engine, greedy_path):
    """The caller's fill deadline (when the edge's next block is expected): a token decoded alone
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
    (empty,) = session.verify_chain(pending, fill_deadline=time.perf_counter() - 1.0)  # the block is due now
    assert empty.stale and empty.token is None and session.forwards == forwards and session.tokens[p:] == want[:1]
    session, pending = corrected()
    (filled,) = session.verify_chain(pending, fill_deadline=time.perf_counter() + 60.0)  # time for a forward
    assert filled.stale and filled.token == want[1] and session.forwards == forwards + 1
    assert session.one_token_s.value > 0  # what the next deadline is weighed against
    # After a deferred bonus the token decoded alone needs no forward: filled whatever the deadline.
    session = new_session(tiny_engine, prompt)
    session.verify_chain([PendingBlock(0, p, want[:3], more_follows=True)])
    (filled,) = session.verify_chain([PendingBlock(0, p + 9, want[9:11])], fill_deadline=time.perf_counter() - 1.0)
    assert filled.stale and filled.token == want[3]


@pytest.mark.parametrize("mode", [Mode.GREEDY, Mode.REJECTION])
def test_a_fill_runs_past_the_deadline_only_where_the_edge_s_guesses_seldom_hold(tiny_engine, greedy_path, mode):
    """A fill that would end half-way between the next block's due time and its own length later
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
        (verdict,) = session.verify_chain(pending, fill_deadline=time.perf_counter() + 10.0)
        assert verdict.stale and (verdict.token is not None) == fills and session.forwards == forwards + fills
    assert fill_overrun_pays(1.0, 1.0, 0.49) and not fill_overrun_pays(1.0, 1.0, 0.5)
    assert not fill_overrun_pays(0.1, 0.0, 0.0)  # the block is due already: nothing is learned earlier
    assert fill_overrun_pays(5.0, 0.1, 0.0)  # the guesses never hold: any head start pays


def test_the_next_block_is_expected_one_measured_gap_after_a_correction():
    """The servicer's clock for the fill deadline: no deadline before a gap was measured or once the
    block came; a block of an older epoch (stale) is no sample; the gap is a moving average."""
    clock = NextBlockClock()
    assert clock.deadline() is None
    clock.corrected(10.0, epoch=1)
    assert clock.deadline() is None  # nothing measured yet: fill
    clock.arrived(10.1, epoch=0)  # a stale block still in flight: not the next chain's
    clock.arrived(10.3, epoch=1)
    assert clock.gap_s.value == pytest.approx(0.3) and clock.deadline() is None  # it came
    clock.corrected(20.0, epoch=2)
    assert clock.deadline() == pytest.approx(20.3)
    clock.arrived(20.8, epoch=2)
    assert clock.gap_s.value == pytest.approx(0.8 * 0.3 + 0.2 * 0.8) and clock.deadline() is None


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


@pytest.mark.parametrize("lie", ["skips-an-uncommitted-draft", "stale-with-accepted-drafts"])
def test_the_edge_refuses_a_verdict_that_does_not_fit_what_it_sent(tiny_engine, drafters, lie):
    class Lying(LocalVerifier):
        def receive(self):
            verdict = super().receive()
            if verdict.accepted >= 2 and not verdict.stale:
                if lie == "skips-an-uncommitted-draft":  # as if the block's first draft had been committed
                    return replace(verdict, start_position=verdict.start_position + 1, accepted=verdict.accepted - 1)
                return replace(verdict, stale=True)
            return verdict

    prompt = tiny_prompt(tiny_engine, TEXTS[0])
    with pytest.raises(ProtocolError, match="does not answer the block"):
        run_decode(drafters["drafter_f32"], Lying(tiny_engine), prompt, GREEDY, max_new_tokens=24, draft_len=4, window=2)


def test_the_token_limit_and_eos_end_a_generation_inside_a_chain(tiny_engine, greedy_path):
    prompt, want = greedy_path
    session = new_session(tiny_engine, prompt, max_new_tokens=6)
    p = len(prompt)
    verdicts = session.verify_chain([PendingBlock(0, p, want[:4], more_follows=True),
                                     PendingBlock(0, p + 4, want[4:8], more_follows=True)])
    assert [v.done for v in verdicts] == [False, True] and verdicts[-1].stop_reason is StopReason.LENGTH
    assert verdicts[-1].accepted == 2 and verdicts[-1].token is None and session.tokens[p:] == want[:6]
    eos = next(iter(tiny_engine.eos_token_ids))
    ended = new_session(tiny_engine, prompt)
    original = ended.engine.eos_token_ids
    try:
        ended.engine.eos_token_ids = {want[2]}  # the target's third token ends the text
        (verdict,) = ended.verify_chain([PendingBlock(0, p, want[:5], more_follows=True)])
    finally:
        ended.engine.eos_token_ids = original
    assert (verdict.done, verdict.stop_reason, verdict.accepted) == (True, StopReason.EOS, 3)
    assert eos in tiny_engine.eos_token_ids


@pytest.mark.parametrize(
    "block, message",
    [
        (PendingBlock(1, 0, [5]), "ahead"),
        (PendingBlock(0, 0, [], more_follows=True), "empty block"),
        (PendingBlock(0, 0, [5] * 17), "exceeds"),
    ],
    ids=["epoch-ahead", "empty-more-follows", "too-long"],
)
def test_blocks_that_cannot_continue_the_session_are_refused(tiny_engine, greedy_path, block, message):
    prompt, _ = greedy_path
    session = new_session(tiny_engine, prompt)
    if block.start_position == 0:
        block = PendingBlock(block.epoch, len(prompt), block.drafts, block.q, block.more_follows)
    with pytest.raises(BlockRejected, match=message):
        session.verify_chain([block])


# ---------------------------------------------------------------- identity under every window


@pytest.mark.parametrize("drafter_name", ["drafter_f32", "drafter_noisy", "ngram"])
@pytest.mark.parametrize("mode", [Mode.GREEDY, Mode.COUPLED])
def test_pipelined_decoding_is_token_identical_to_target_only(tiny_engine, drafters, drafter_name, mode):
    drafter = drafters[drafter_name]
    for text, seed in itertools.product(TEXTS, (0, 5)):
        prompt = tiny_prompt(tiny_engine, text)
        params = SamplingParams(mode=mode, temperature=0.9, seed=seed)
        want = generate(tiny_engine, drafter, prompt, params, max_new_tokens=40, draft_len=0)
        for draft_len, window in ((1, 4), (3, 2), (4, 3), (8, 8)):
            got = generate(tiny_engine, drafter, prompt, params, max_new_tokens=40, draft_len=draft_len, window=window)
            assert got.tokens == want.tokens, f"D={draft_len} W={window} seed={seed}"
            assert got.stop_reason == want.stop_reason


class PacedVerifier(LocalVerifier):
    """A cloud whose verdict for a block is ready once the loop has asked ``lag`` times since the block
    went (the loop asks before each drafted token: time measured in drafter steps); ``lag`` None: never
    before ``receive`` (drafting is never stopped). Records each block sent as (start, drafts)."""

    def __init__(self, engine, lag: int | None) -> None:
        super().__init__(engine)
        self.lag, self.asked = lag, 0
        self.sent_at: deque[int] = deque()
        self.blocks: list[tuple[int, int]] = []

    def open(self, *args, **kwargs):
        terms = super().open(*args, **kwargs)
        self.sent_at.appendleft(self.asked - (self.lag or 0))  # the first position's, answered with the Opened
        return terms

    def send(self, epoch, start_position, block, more_follows):
        super().send(epoch, start_position, block, more_follows)
        self.sent_at.append(self.asked)
        self.blocks.append((start_position, len(block.tokens)))

    def ready(self) -> bool:
        self.asked += 1
        return self.lag is not None and bool(self.sent_at) and self.asked - self.sent_at[0] >= self.lag

    def receive(self):
        self.sent_at.popleft()
        return super().receive()


@pytest.mark.parametrize("wrong_every", [3, 7])
def test_drafting_stops_for_a_verdict_that_voids_the_block_and_goes_on_after_one_that_does_not(tiny_engine,
                                                                                               tiny_vocab, wrong_every):
    """A verdict that arrives while a block is drafted is read before the next draft: a correction ends
    the block there (it is not sent), an acceptance or a stale block's token that the block guessed lets
    it go on to its full length. The output stays target-only's; less is drafted, fewer blocks go stale."""
    prompt = tiny_prompt(tiny_engine, TEXTS[1])
    want = greedy_continuation(tiny_engine, prompt, 48)
    runs = {}
    for lag in (None, 2, 6):  # never (drafting is not stopped), within the next block, one and a half blocks
        drafter = ScriptedDrafter(tiny_vocab[0], want, len(prompt), right=False, wrong_every=wrong_every)
        link = PacedVerifier(tiny_engine, lag)
        got = run_decode(drafter, link, prompt, GREEDY, max_new_tokens=48, draft_len=4, window=3)
        assert got.tokens == want[:48], f"lag {lag}"
        runs[lag] = (drafter.stats.drafted, got.stats.stale, link.blocks)
    for lag in (2, 6):
        drafted, stale, blocks = runs[lag]
        assert drafted < runs[None][0] and stale < runs[None][1], (lag, runs)
        # Blocks that went were drafted to their full length, the limit aside (a chain's first block
        # holds guesses besides): drafting went on after the verdicts that did not void them.
        assert all(drafts >= 4 for start, drafts in blocks if start - len(prompt) + 4 < 47), (lag, blocks)


class FarVerifier(LocalVerifier):
    """A cloud at a long round trip with quick forwards: each block reaches it after it has answered
    the blocks sent before (one forward each, nothing coalesced; a stale block has no usable block
    behind it, so it gets a token decoded), and no verdict is ready before ``receive``."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self._on_the_way: list[PendingBlock] = []

    def send(self, epoch, start_position, block, more_follows):
        super().send(epoch, start_position, block, more_follows)
        self._on_the_way.append(self._pending.pop())

    def ready(self) -> bool:
        return False

    def receive(self):
        if not self._verdicts and not self._pending and self._on_the_way:
            self._pending.append(self._on_the_way.pop(0))
        return super().receive()


def test_a_drafter_whose_every_chain_goes_stale_is_measured_through_the_stale_verdicts(tiny_engine, tiny_vocab):
    """The regime of a weak drafter on a long round trip, through the decode loop: the drafter is wrong
    at every position, so after the first correction each chain's first block goes out guessing the
    tokens decoded for the void blocks before it, wrongly, and comes back stale. No drafted block is
    verified after the first, yet the stale verdicts time the network and the drafter, and the guesses
    are first drafts' trials: the controller sees drafting fail and weighs the cloud alone against it.
    The output stays target-only's."""
    prompt = tiny_prompt(tiny_engine, TEXTS[0])
    want = greedy_continuation(tiny_engine, prompt, 32)
    drafter = ScriptedDrafter(tiny_vocab[0], want, len(prompt), right=False, wrong_every=1)
    controller = CountingController(max_draft_len=4, window=4, cloud_window=16)
    controller.observe_stale = _recorded(controller.observe_stale, stale := [])
    got = run_decode(drafter, FarVerifier(tiny_engine), prompt, GREEDY, max_new_tokens=32, draft_len=4,
                     window=4, controller=controller)
    assert got.tokens == want[:32]
    assert controller.blocks == 1, got.stats  # the first chain's block (the early block's timings span the prefill)
    chains_stale = [k for k in stale if k["trip_s"] is not None and k["drafted"] > 4]  # a chain's first block: guesses
    assert len(chains_stale) >= 3 and got.stats.fill_guesses >= 3 and got.stats.fill_guesses_hit == 0, got.stats
    assert all(k["trip_s"] >= k["cloud_s"] >= 0 and k["draft_s"] > 0 for k in chains_stale), chains_stale
    assert controller.acceptances >= controller.blocks + got.stats.fill_guesses  # the guesses, each a trial
    assert controller.acceptance.per_position(1)[0] < 0.2
    assert controller.predict_drafting(4) < controller.predict_cloud()


def _recorded(method, calls: list):
    """``method``, recording each call's keyword arguments (and the positional ones by name) in ``calls``."""
    def record(committed, rebased=0, forward_s=0.0, **kwargs):
        calls.append(dict(committed=committed, rebased=rebased, forward_s=forward_s, **kwargs))
        return method(committed, rebased, forward_s, **kwargs)
    return record


def test_pipelining_shares_forwards_between_blocks(tiny_engine, drafters):
    prompt = tiny_prompt(tiny_engine, TEXTS[1])
    lockstep = generate(tiny_engine, drafters["drafter_f32"], prompt, GREEDY, max_new_tokens=40, draft_len=4)
    piped = generate(tiny_engine, drafters["drafter_f32"], prompt, GREEDY, max_new_tokens=40, draft_len=4, window=4)
    assert piped.tokens == lockstep.tokens
    assert piped.stats.target_forwards < lockstep.stats.target_forwards  # queued blocks share a forward


def test_rejection_mode_with_blocks_in_flight_samples_the_target(tiny_engine, drafters):
    prompt = tiny_prompt(tiny_engine, "It was the best of times")
    exact = exact_distribution(tiny_engine, prompt, SamplingParams(mode=Mode.REJECTION, temperature=1.0, top_k=4))
    counts, n = Counter(), 1500
    for seed in range(n):
        params = SamplingParams(mode=Mode.REJECTION, temperature=1.0, top_k=4, seed=seed)
        got = generate(tiny_engine, drafters["drafter_noisy"], prompt, params, max_new_tokens=3, draft_len=1, window=3)
        counts[tuple(got.tokens)] += 1
        assert got.stats.rebased == 0  # a draft's q̃ holds only on the path it was drafted on
    # Sampling noise alone gives a TV distance of about 0.05 at this n over these outcomes.
    assert total_variation(counts, n, exact) < 0.08


# ---------------------------------------------------------------- over gRPC


@pytest.mark.parametrize("mode", [Mode.GREEDY, Mode.COUPLED])
def test_pipelined_edge_over_grpc_is_token_identical(tiny_engine, tiny_vocab, drafters, verifier, mode):
    drafter = drafters["drafter_noisy"]
    for text in TEXTS:
        prompt = tiny_prompt(tiny_engine, text)
        params = SamplingParams(mode=mode, temperature=0.9, seed=2)
        want = generate(tiny_engine, drafter, prompt, params, max_new_tokens=32, draft_len=0)
        for draft_len, window in ((3, 2), (6, 4)):
            link = GrpcVerifier(verifier.address, vocab_size=tiny_vocab[0], fingerprint=tiny_vocab[1])
            got = run_decode(drafter, link, prompt, params, max_new_tokens=32, draft_len=draft_len, window=window)
            assert got.tokens == want.tokens, f"D={draft_len} W={window}"
            assert len(link.rtt_samples_s) == got.stats.rounds + got.stats.stale
            assert len(link.block_log) == got.stats.rounds + got.stats.filled  # a dropped block had no forward
            assert got.stats.target_forwards <= got.stats.rounds + got.stats.filled + 1


@pytest.mark.parametrize("stale_blocks", ["rebase", "decode", "drop"])
def test_stale_blocks_come_back_with_tokens_the_cloud_decoded_alone(tiny_engine, tiny_vocab, drafters, stale_blocks):
    """A rejection while later blocks are in flight, over gRPC: each stale block gets one verdict, with
    the next token decoded (``--stale-blocks drop``: empty; ``rebase``: after the drafts sent for the
    positions past the correction, where they were right), and the next chain's guesses for those
    tokens are skipped where right. The output is target-only's either way. The drafter is wrong at
    every fourth position and right elsewhere, also past its own wrong tokens."""
    from cloud.limits import ServiceLimits
    from cloud.server import BackgroundServer, ServerConfig

    totals = Counter()
    limits = ServiceLimits(decode_stale=stale_blocks != "drop", rebase_stale=stale_blocks == "rebase")
    with BackgroundServer(tiny_engine, ServerConfig(port=0, limits=limits)) as server:
        for text, seed in itertools.product(TEXTS, (1, 2)):
            prompt = tiny_prompt(tiny_engine, text)
            params = SamplingParams(mode=Mode.COUPLED, temperature=0.9, seed=seed)
            want = generate(tiny_engine, drafters["drafter_f32"], prompt, params, max_new_tokens=32, draft_len=0)
            drafter = ScriptedDrafter(tiny_vocab[0], want.tokens, len(prompt), right=False, wrong_every=4)
            link = _TimingsSeen(server.address, vocab_size=tiny_vocab[0], fingerprint=tiny_vocab[1])
            got = run_decode(drafter, link, prompt, params, max_new_tokens=32, draft_len=3, window=4)
            assert got.tokens == want.tokens, f"seed {seed}"
            for verdict, cloud_s, forward_s in link.seen:  # the forward alone, within the cloud's time on the block
                assert 0 <= forward_s <= cloud_s
                if verdict.stale and verdict.token is None:
                    assert forward_s == 0  # answered empty: no forward
                if verdict.accepted:
                    assert forward_s > 0  # its drafts were verified in a forward
            stats = got.stats
            assert stats.generated == len(got.tokens) and stats.target_forwards <= stats.rounds + stats.filled + 1
            totals.update(stale=stats.stale, filled=stats.filled, rebased=stats.rebased,
                          corrections=stats.corrections_guessed, guesses=stats.fill_guesses,
                          guesses_hit=stats.fill_guesses_hit)
    assert totals["corrections"] > 0 and totals["stale"] > 0
    # The tokens decoded for stale blocks, which the next chains' first blocks guessed (the drafter's own
    # tokens, right but at every fourth position): none with --stale-blocks drop.
    if stale_blocks == "drop":
        assert totals["guesses"] == 0
    else:
        assert 0 < totals["guesses_hit"] <= totals["guesses"], totals
    assert totals["filled"] > 0 if stale_blocks != "drop" else totals["filled"] == 0
    assert totals["rebased"] > 0 if stale_blocks == "rebase" else totals["rebased"] == 0, totals


class _TimingsSeen(GrpcVerifier):
    """Each verdict with the cloud's time on it and its forward's alone, as the edge read them."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[Verdict, float, float]] = []

    def receive(self) -> Verdict:
        verdict = super().receive()
        self.seen.append((verdict, self.last_cloud_s, self.last_forward_s))
        return verdict


def test_only_an_edge_that_takes_rebased_drafts_gets_them_and_stale_blocks_bring_theirs(tiny_engine, tiny_vocab,
                                                                                         drafters):
    """Over gRPC: an edge from before ``Verdict.rebased`` (no ``Open.takes_rebased``) would drop those
    tokens, so it is answered with tokens decoded alone; a current edge gets them, and the drafts of
    stale blocks that arrive after the correction count too (their ids are decoded, nothing else)."""
    from cloud.server import BackgroundServer, ServerConfig

    class OldEdge(GrpcVerifier):
        def _open_message(self, *args, **fields):
            message = super()._open_message(*args, **fields)
            message.takes_rebased = False
            return message

    params = SamplingParams(mode=Mode.COUPLED, temperature=0.9, seed=1)
    prompt = tiny_prompt(tiny_engine, TEXTS[0])
    want = generate(tiny_engine, drafters["drafter_f32"], prompt, params, max_new_tokens=32, draft_len=0).tokens
    rebased = {}
    with BackgroundServer(tiny_engine, ServerConfig(port=0)) as server:
        for edge in (OldEdge, GrpcVerifier):
            drafter = ScriptedDrafter(tiny_vocab[0], want, len(prompt), right=False, wrong_every=4)
            link = edge(server.address, vocab_size=tiny_vocab[0], fingerprint=tiny_vocab[1])
            got = run_decode(drafter, link, prompt, params, max_new_tokens=32, draft_len=3, window=4)
            assert got.tokens == want, edge.__name__
            rebased[edge] = got.stats.rebased
    assert rebased[OldEdge] == 0 and rebased[GrpcVerifier] > 0


def test_a_stale_blocks_ids_are_decoded_only_for_a_session_that_rebases(tiny_engine, greedy_path):
    from cloud.limits import ServiceLimits
    from cloud.servicer import VerifierServicer
    from shared.wire import OpenRequest

    prompt, want = greedy_path
    servicer = VerifierServicer(tiny_engine, ServiceLimits())
    payload = codec.encode_tokens(want[4:6], tiny_engine.vocab_size).data

    async def stale_block(takes_rebased: bool, mode: Mode) -> PendingBlock:
        params = SamplingParams(mode=mode, temperature=1.0, seed=0)
        entry = await servicer._new_session(OpenRequest(params, prompt, 40), 8, "test", takes_rebased=takes_rebased)
        try:
            entry.session.epoch = 1  # as after a correction
            return servicer._decode_draft(entry, pb.Draft(epoch=0, start_position=len(prompt) + 4, payload=payload))
        finally:
            servicer.table.remove(entry)

    assert asyncio.run(stale_block(True, Mode.COUPLED)).drafts == want[4:6]
    assert asyncio.run(stale_block(False, Mode.COUPLED)).drafts == []  # an edge from before rebasing
    assert asyncio.run(stale_block(True, Mode.REJECTION)).drafts == []  # (q̃ is never decoded for a stale block)
    servicer.scheduler.shutdown()


def test_the_edge_voids_its_chain_when_stale_tokens_leave_its_first_live_block_unusable():
    from edge.decode_loop import _first_live_continues, _InFlight

    prompt_len, generated = 10, [1, 2, 3]  # positions 10, 11, 12 committed; the next is 13
    block = _InFlight(1, 12, DraftBlock([3, 4, 5]), True)  # guesses 3 for position 12, then drafts 4, 5
    void = _InFlight(0, 20, DraftBlock([9, 9]), False, void=True)
    assert _first_live_continues(deque([void, block]), generated, prompt_len)
    assert _first_live_continues(deque([block]), [*generated, 4], prompt_len)  # a right guess: 5 still to verify
    assert not _first_live_continues(deque([block]), [*generated, 7], prompt_len)  # a wrong one
    assert not _first_live_continues(deque([block]), [*generated, 4, 5], prompt_len)  # every draft committed
    assert not _first_live_continues(deque([_InFlight(1, 14, DraftBlock([6]), True)]), generated, prompt_len)  # past
    assert _first_live_continues(deque([void, _InFlight(1, 13, DraftBlock([]), False)]), generated, prompt_len)


def test_a_fill_guess_is_judged_by_the_chain_s_first_block_in_flight_or_being_drafted():
    from edge.decode_loop import _Drafting, _guesses, _InFlight

    void = _InFlight(0, 20, DraftBlock([9, 9]), False, void=True)
    first = _InFlight(1, 12, DraftBlock([3, 4, 5]), True)  # drafted from position 12: guesses 3, then 4, 5
    assert _guesses(deque([void, first]), None, 12, [3]) == (0, [3])
    assert _guesses(deque([void, first]), None, 12, [3, 7]) == (0, [3, 4])  # a rebased draft, then a token
    assert _guesses(deque([void, first]), None, 13, [4]) == (1, [4])  # its second draft
    drafting = _Drafting(12, 6, 20, DraftBlock([3]))  # drafted one guess so far
    assert _guesses(deque([void]), drafting, 12, [8, 4]) == (0, [3])
    assert _guesses(deque([void]), _Drafting(12, 6, 20), 12, [3]) is None  # nothing drafted yet
    assert _guesses(deque([void]), None, 12, [3]) is None  # no chain drafted after the correction
    # The block being drafted goes on while the committed tokens from its start are its drafts.
    prompt_len = 10
    assert drafting.continues([0, 0], prompt_len) and drafting.continues([0, 0, 3], prompt_len)
    assert not drafting.continues([0, 0, 8], prompt_len) and not drafting.continues([0, 0, 3, 4], prompt_len)


def test_the_cloud_bounds_blocks_in_flight(tiny_engine, greedy_path):
    """More blocks waiting than the limit ends the stream; the check runs before any forward."""
    from cloud.limits import ServiceLimits
    from cloud.servicer import VerifierServicer, _Abort
    from shared.wire import OpenRequest

    prompt, want = greedy_path
    servicer = VerifierServicer(tiny_engine, ServiceLimits(max_blocks_in_flight=2))

    async def scenario(blocks: int):
        entry = await servicer._new_session(OpenRequest(GREEDY, prompt, 40), 16, owner="test")
        frames: asyncio.Queue = asyncio.Queue()
        for b in range(blocks):  # all queued before the servicer looks: one drain sees them together
            payload = codec.encode_tokens(want[2 * b : 2 * b + 2], tiny_engine.vocab_size).data
            draft = pb.Draft(epoch=0, start_position=len(prompt) + 2 * b, payload=payload, more_follows=b < blocks - 1)
            frames.put_nowait((draft, time.perf_counter()))
        forwards = entry.session.forwards
        verdicts = servicer._verdicts(entry, entry.stream, frames, [])
        out = []
        try:
            async for verdict, *_ in verdicts:
                out.append(verdict)
                if len(out) == blocks:
                    break
        except _Abort as exc:
            return exc, entry.session.forwards - forwards
        finally:
            await verdicts.aclose()
            servicer.table.remove(entry)
        return out, entry.session.forwards - forwards

    verdicts, forwards = asyncio.run(asyncio.wait_for(scenario(2), 30))
    assert [v.accepted for v in verdicts] == [2, 2] and forwards == 1  # within the limit: one shared forward
    refused, forwards = asyncio.run(asyncio.wait_for(scenario(3), 30))
    assert isinstance(refused, _Abort) and refused.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "more than 2 blocks in flight" in str(refused) and forwards == 0
    servicer.scheduler.shutdown()


def test_the_edge_respects_the_window_the_cloud_allows(tiny_engine, tiny_vocab, drafters, verifier):
    link = GrpcVerifier(verifier.address, vocab_size=tiny_vocab[0], fingerprint=tiny_vocab[1])
    prompt = tiny_prompt(tiny_engine, TEXTS[0])
    got = run_decode(drafters["drafter_f32"], link, prompt, GREEDY, max_new_tokens=24, draft_len=2, window=1000)
    want = generate(tiny_engine, drafters["drafter_f32"], prompt, GREEDY, max_new_tokens=24, draft_len=0)
    assert got.tokens == want.tokens
    with pytest.raises(ValueError, match="window"):
        run_decode(drafters["drafter_f32"], link, prompt, GREEDY, max_new_tokens=24, draft_len=2, window=0)
    assert VerifierError  # the client's error type stays importable for callers


def test_the_first_token_comes_with_the_open_when_asked(tiny_engine, tiny_vocab, greedy_path, verifier):
    """Open.first_token: the verdict for the first position rides inside Opened, before any draft is sent."""
    prompt, want = greedy_path
    encoded = codec.encode_tokens(prompt, tiny_vocab[0])
    opening = pb.EdgeFrame(open=pb.Open(vocab_size=tiny_vocab[0], vocab_fingerprint=tiny_vocab[1], first_token=True,
                                        sampling=sampling_to_proto(GREEDY), prompt=encoded.data, max_new_tokens=8))
    frames = queue.Queue()
    frames.put(opening)
    with grpc.insecure_channel(verifier.address) as channel:
        replies = pb_grpc.VerifierStub(channel).Decode(iter(frames.get, None), timeout=30)
        opened = next(replies).opened  # nothing was sent after the Open
        first = opened.first_verdict
        assert opened.HasField("first_verdict") and opened.forwards == 1
        assert (first.epoch, first.start_position, first.accepted, first.token, first.bonus) == (0, len(prompt), 0, want[0], True)
        frames.put(pb.EdgeFrame(draft=pb.Draft(epoch=0, start_position=len(prompt) + 1,
                                               payload=codec.encode_tokens(want[1:4], tiny_vocab[0]).data)))
        second = next(replies).verdict
        assert (second.accepted, second.token) == (3, want[4])
        frames.put(pb.EdgeFrame(close=pb.Close()))
        frames.put(None)
        assert list(replies) == []


# ---------------------------------------------------------------- the drafter's second choice (hedge hit rate)


def test_the_runner_up_is_the_second_place_of_the_same_race():
    from edge.drafter import propose
    from shared.logits import top_candidates
    from shared.noise import Purpose, exponential

    rng = np.random.default_rng(0)
    logits = rng.normal(size=300).astype(np.float32)
    greedy = propose(logits, GREEDY, 7)
    order = np.argsort(-logits)
    assert (greedy.token, greedy.runner_up) == (order[0], order[1])
    params = SamplingParams(mode=Mode.COUPLED, temperature=0.9, seed=3)
    coupled = propose(logits, params, 7)
    ids, probs = top_candidates(logits, params, limit=64)
    race = ids[np.argsort(exponential(3, 7, ids, Purpose.SAMPLE) / probs)]
    assert (coupled.token, coupled.runner_up) == (race[0], race[1])
    assert propose(logits, SamplingParams(mode=Mode.REJECTION, temperature=0.9), 7).runner_up is None


@pytest.mark.parametrize("right", [True, False])
def test_corrections_are_scored_against_the_drafters_second_choice(tiny_engine, greedy_path, right):
    prompt, want = greedy_path
    drafter = ScriptedDrafter(tiny_engine.vocab_size, want, len(prompt), right)
    got = generate(tiny_engine, drafter, prompt, GREEDY, max_new_tokens=20, draft_len=3, window=2)
    stats = got.stats
    assert got.tokens == want[:20]  # every draft rejected, every correction the target's token
    assert stats.corrections_guessed >= 10
    assert stats.corrections_hit == (stats.corrections_guessed if right else 0)
    assert stats.correction_hit_rate == (1.0 if right else 0.0)


# ---------------------------------------------------------------- the first block leaves with the Open


@pytest.mark.parametrize("cloud_limit", [16, 3])
def test_the_first_block_leaves_before_the_opened(tiny_engine, tiny_models, tiny_vocab, cloud_limit):
    """The edge drafts its first block while the prefill runs (on its own guess for the first
    token) and sends it before the Opened comes; a verifier whose draft limit it exceeds drops it
    unanswered, and the edge drafts again. Output is target-only's either way."""
    from cloud.limits import ServiceLimits
    from cloud.server import BackgroundServer, ServerConfig
    from edge.early_block import EARLY_DRAFT_LEN

    drafter = LlamaDrafter(tiny_models["drafter_noisy"], n_ctx=512, n_threads=1, f32_kv_cache=True)
    sent: list = []

    class Watching(GrpcVerifier):
        def send(self, epoch, start_position, block, more_follows, *, before_opened=False):
            sent.append((before_opened, start_position, len(block.tokens)))
            return super().send(epoch, start_position, block, more_follows, before_opened=before_opened)

        def _send_early_block(self, start_position):  # over loopback the Opened could beat the drafting
            super()._send_early_block(start_position)
            deadline = time.monotonic() + 10
            while self._early_sent is None and time.monotonic() < deadline:
                time.sleep(0.001)

    chained = 0
    try:
        with BackgroundServer(tiny_engine, ServerConfig(port=0, limits=ServiceLimits(max_draft_len=cloud_limit))) as server:
            for seed in range(4):  # the noisy drafter's guess for the first token is sometimes wrong
                prompt = tiny_prompt(tiny_engine, TEXTS[seed % len(TEXTS)])
                params = SamplingParams(mode=Mode.COUPLED, temperature=0.9, seed=seed)
                want = generate(tiny_engine, drafter, prompt, params, max_new_tokens=30, draft_len=0)
                sent.clear()
                link = Watching(server.address, vocab_size=tiny_vocab[0], fingerprint=tiny_vocab[1])
                got = run_decode(drafter, link, prompt, params, max_new_tokens=30, draft_len=5, window=2)
                assert got.tokens == want.tokens
                assert sent[0] == (True, len(prompt) + 1, EARLY_DRAFT_LEN) and not any(e for e, _, _ in sent[1:])
                if cloud_limit < EARLY_DRAFT_LEN:  # dropped: drafted again after the first token, within the limit
                    assert sent[1] == (False, len(prompt) + 1, cloud_limit)
                else:  # kept: the next block continues it at once (when the guess was right)
                    chained += sent[1][1] == len(prompt) + 1 + EARLY_DRAFT_LEN
        assert chained or cloud_limit < EARLY_DRAFT_LEN
    finally:
        drafter.close()


def test_a_wrong_guess_for_the_first_token_holds_the_chain_until_the_early_block_is_answered(tiny_engine, greedy_path):
    """ScriptedDrafter's guesses are all wrong: the early block rests on a token the target did not
    pick, so nothing may be chained on it (its positions would be off); it is answered, then
    drafting resumes from the committed tokens."""
    prompt, want = greedy_path
    drafter = ScriptedDrafter(tiny_engine.vocab_size, want, len(prompt), right=False)
    got = generate(tiny_engine, drafter, prompt, GREEDY, max_new_tokens=16, draft_len=3, window=3)
    assert got.tokens == want[:16]
    # Its verdict measures nothing about the drafter (it was drafted after a token the target did not
    # pick): the controller's acceptance hears only of the blocks drafted after it.
    controller = CountingController(max_draft_len=3, window=3, cloud_window=16)
    drafter = ScriptedDrafter(tiny_engine.vocab_size, want, len(prompt), right=False)
    got = generate(tiny_engine, drafter, prompt, GREEDY, max_new_tokens=16, draft_len=3, window=3, controller=controller)
    assert got.tokens == want[:16] and controller.blocks > 0
    assert controller.acceptances == controller.blocks  # the early block (answered: a round) fed nothing
    assert got.stats.rounds > controller.blocks


def test_an_early_block_is_dropped_past_the_session_limit_and_refused_past_the_protocol_cap(tiny_engine, tiny_vocab,
                                                                                          verifier):
    from shared.wire import MAX_EARLY_DRAFTS

    prompt = tiny_prompt(tiny_engine, TEXTS[0])
    encoded = codec.encode_tokens(prompt, tiny_vocab[0])
    opening = pb.EdgeFrame(open=pb.Open(vocab_size=tiny_vocab[0], vocab_fingerprint=tiny_vocab[1], first_token=True,
                                        sampling=sampling_to_proto(GREEDY), prompt=encoded.data, max_new_tokens=8))
    stub = pb_grpc.VerifierStub(grpc.insecure_channel(verifier.address))

    def early(n: int) -> pb.EdgeFrame:
        packed = codec.encode_draft([5] * n, tiny_vocab[0])
        return pb.EdgeFrame(draft=pb.Draft(start_position=len(prompt) + 1, payload=packed.data, compressed=packed.compressed,
                                           before_opened=True))

    replies = list(stub.Decode(iter([opening, early(20), pb.EdgeFrame(close=pb.Close())]), timeout=30))
    assert [r.WhichOneof("kind") for r in replies] == ["opened"]  # 20 > the session's 16: dropped, unanswered
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Decode(iter([opening, early(MAX_EARLY_DRAFTS + 1)]), timeout=30))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_the_first_token_reaches_the_caller_before_the_main_thread_drafts(tiny_engine, tiny_models):
    """With a wide window and the early block standing, the first token (in hand with the Opened)
    is handed out before the loop drafts anything more; the early block's timings, which span the
    prefill, are not fed to the controller."""
    import threading

    events: list[str] = []
    inner = LlamaDrafter(tiny_models["drafter_f32"], n_ctx=512, n_threads=1, f32_kv_cache=True)
    main = threading.current_thread()

    class Logged:
        vocab_size, stats = inner.vocab_size, inner.stats

        def __getattr__(self, name):
            return getattr(inner, name)

        def draft(self, n, stop=None):
            if threading.current_thread() is main:
                events.append("draft")
            return inner.draft(n, stop)

    controller = CountingController(max_draft_len=4, window=4, cloud_window=16)
    try:
        prompt = tiny_prompt(tiny_engine, TEXTS[0])
        got = generate(tiny_engine, Logged(), prompt, GREEDY, max_new_tokens=24, draft_len=4, window=4,
                       controller=controller, on_tokens=lambda tokens: events.append("tokens"))
        assert len(got.tokens) == 24
        assert events.index("tokens") < events.index("draft")
        # Every drafted block fed acceptance (observe_block goes through observe_acceptance); the
        # early block fed nothing else.
        assert controller.acceptances == controller.blocks + 1 and controller.blocks > 0
    finally:
        inner.close()


@pytest.mark.parametrize("lie", ["id-outside-the-vocabulary", "more-rebased-than-verified", "no-token-after-them"])
def test_the_edge_refuses_a_stale_verdict_with_bad_rebased_drafts(tiny_vocab, lie):
    """A cloud (a real gRPC server here) whose stale verdict carries impossible rebased drafts ends the
    generation with an error that says so, before anything of it is taken."""
    from concurrent import futures

    vocab_size = tiny_vocab[0]
    prompt = [1, 2, 3]
    bad = {
        "id-outside-the-vocabulary": dict(rebased=[vocab_size + 5], rebased_verified=1, token=1),
        "more-rebased-than-verified": dict(rebased=[1, 2], rebased_verified=1, token=1),
        "no-token-after-them": dict(rebased=[1], rebased_verified=1),
    }[lie]

    class Hostile(pb_grpc.VerifierServicer):
        def Decode(self, request_iterator, context):
            next(request_iterator)  # the Open
            first = pb.Verdict(epoch=0, start_position=len(prompt), token=7, bonus=True)
            yield pb.CloudFrame(opened=pb.Opened(resume_ticket=b"t" * 16, vocab_size=vocab_size, max_draft_len=8,
                                                 max_blocks_in_flight=4, first_verdict=first))
            next(request_iterator)  # a block
            yield pb.CloudFrame(verdict=pb.Verdict(epoch=0, start_position=len(prompt) + 1, stale=True, bonus=True,
                                                   **bad))
            context.abort(grpc.StatusCode.CANCELLED, "done")

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_VerifierServicer_to_server(Hostile(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        link = GrpcVerifier(f"127.0.0.1:{port}", vocab_size=vocab_size, fingerprint=tiny_vocab[1], outage_budget_s=0.5)
        link.open(prompt, GREEDY, max_new_tokens=16, max_draft_len=8)
        assert link.receive().token == 7
        link.send(0, len(prompt) + 1, DraftBlock([4, 5]), False)
        with pytest.raises(VerifierError, match="malformed verdict"):
            link.receive()
        assert len(link.block_log) == 1  # the first verdict's: nothing was taken from the refused one
        link.close()
    finally:
        server.stop(0)
