"""Decoding ahead (``cloud.decode_ahead``): after a correction, with nothing of the edge's pending, the cloud
decodes on and tells those tokens with the verdict of the edge's next block: as accepted drafts where the
block's first drafts match them, else first in a stale or an empty block's verdict. The tokens are always
the target's own; only an edge that asks gets them."""

from __future__ import annotations

import time

import pytest
from helpers import GREEDY, new_session

from cloud.decode_ahead import ChainStartGuesses, breaks_chain, decode_ahead_steps, decodes_ahead
from cloud.engine import run_alone
from cloud.session import PendingBlock, SessionPolicy, VerifierSession
from cloud.step_result import StepResult
from shared.params import Mode, SamplingParams
from shared.verdict import StopReason, Verdict


def _corrected(engine, prompt, want, **policy):
    """A session that corrected the edge's first block at its third draft (3 tokens committed)."""
    session = new_session(engine, prompt, decode_ahead=True, **policy)
    p = len(prompt)
    wrong = (want[2] + 1) % engine.vocab_size
    (verdict,) = session.verify_chain([PendingBlock(0, p, [want[0], want[1], wrong, want[3]])])
    assert verdict.is_correction and breaks_chain(verdict) and session.tokens[p:] == want[:3]
    return session


def _ahead(session, count: int) -> None:
    for _ in range(count):
        assert decodes_ahead(session, deadline=None)
        step = run_alone(decode_ahead_steps(session), session.engine)
        assert step.verdicts == [] and step.rows > 0 and step.client_tokens == 0  # credited when told


def test_a_block_that_guessed_the_tokens_decoded_ahead_counts_them_accepted(tiny_engine, greedy_path):
    """The edge's next block starts where its last verdict left it; its first drafts matched the two tokens
    decoded ahead, so its verdict starts there and counts them as accepted drafts, then verifies the rest."""
    prompt, want = greedy_path
    p = len(prompt)
    session = _corrected(tiny_engine, prompt, want)
    _ahead(session, 2)
    assert session.tokens[p:] == want[:5] and session.ahead.tokens == want[3:5]
    wrong = (want[7] + 1) % tiny_engine.vocab_size
    (verdict,) = session.verify_chain([PendingBlock(1, p + 3, [*want[3:7], wrong])])
    assert (verdict.start_position, verdict.accepted, verdict.token, verdict.ahead) == (p + 3, 4, want[7], 2)
    assert verdict.committed([*want[3:7], wrong]) == want[3:8] and session.tokens[p:] == want[:8]
    assert not session.ahead  # told


def test_a_block_that_guessed_them_wrong_is_stale_and_its_verdict_carries_them(tiny_engine, greedy_path):
    """A block whose drafts do not match the tokens decoded ahead is stale; its verdict carries them first,
    then what the forward decoded for it (nothing usable behind it): its own draft past the mismatch,
    verified where it lies, and the token after."""
    prompt, want = greedy_path
    p = len(prompt)
    session = _corrected(tiny_engine, prompt, want)
    _ahead(session, 2)
    other = (want[4] + 1) % tiny_engine.vocab_size
    (verdict,) = session.verify_chain([PendingBlock(1, p + 3, [want[3], other, want[5]])])
    assert verdict.stale and verdict.start_position == p + 3 and verdict.ahead == 2
    assert verdict.committed([]) == want[3:7] and session.tokens[p:] == want[:7]
    assert verdict.rebased == tuple(want[3:6]) and len(verdict.rebased) <= verdict.rebased_verified


def test_an_empty_block_s_verdict_carries_them_before_its_token(tiny_engine, greedy_path):
    prompt, want = greedy_path
    p = len(prompt)
    session = _corrected(tiny_engine, prompt, want)
    _ahead(session, 3)
    (verdict,) = session.verify_chain([PendingBlock(1, p + 3, [])])
    assert not verdict.stale and verdict.start_position == p + 3 and verdict.ahead == 3
    assert verdict.committed([]) == want[3:7] and session.tokens[p:] == want[:7]


def test_a_block_past_where_the_edge_was_told_is_stale(tiny_engine, greedy_path):
    """A block cannot start inside the tokens decoded ahead (the edge has not been told them): stale,
    whatever its drafts; its verdict tells them."""
    prompt, want = greedy_path
    p = len(prompt)
    session = _corrected(tiny_engine, prompt, want, max_branches=1)
    _ahead(session, 2)
    (verdict,) = session.verify_chain([PendingBlock(1, p + 4, want[4:8])])
    assert verdict.stale and verdict.start_position == p + 3 and verdict.committed([])[:2] == want[3:5]
    # Nor may a hedged block be verified while tokens are held (its branches' numbers would not be the edge's).
    _ahead(session, 1)
    end = len(session.tokens)
    hedged = PendingBlock(1, end - 1, [session.tokens[-1], *want[end - p:end - p + 2]],
                          branches=((1, [want[end - p + 1]]),))
    (verdict,) = session.verify_chain([hedged])
    assert verdict.stale and verdict.ahead == 1


def test_tokens_decoded_ahead_to_the_end_are_told_with_the_final_verdict(tiny_engine, greedy_path):
    """Decoding ahead stops at the token limit; the next block's verdict tells the tokens and the end, and
    the session takes nothing after it."""
    prompt, want = greedy_path
    p = len(prompt)
    session = _corrected(tiny_engine, prompt, want, max_new_tokens=5)
    _ahead(session, 2)
    assert session.done and session.stop_reason is StopReason.LENGTH and not decodes_ahead(session, None)
    (verdict,) = session.verify_chain([PendingBlock(1, p + 3, want[3:6])])
    assert verdict.done and verdict.stop_reason is StopReason.LENGTH and verdict.ahead == 2
    assert verdict.committed([]) == want[3:5]
    with pytest.raises(Exception, match="finished"):
        session.verify_chain([PendingBlock(1, p + 5, want[5:7])])


def test_tokens_decoded_ahead_to_the_end_are_told_at_once_to_an_edge_that_takes_it(tiny_engine, greedy_path):
    """To an edge that takes a verdict no block asked for (``Open.takes_unasked_end``), the forward that ends the
    session answers with the final verdict: every token held, from where the edge's last verdict left it."""
    prompt, want = greedy_path
    p = len(prompt)
    session = _corrected(tiny_engine, prompt, want, max_new_tokens=6, tell_end=True)
    _ahead(session, 2)  # (not the end yet: nothing told)
    step = run_alone(decode_ahead_steps(session), session.engine)
    (verdict,) = step.verdicts
    assert verdict.unasked and verdict.done and verdict.stale and verdict.stop_reason is StopReason.LENGTH
    assert (verdict.epoch, verdict.start_position, verdict.accepted, verdict.ahead) == (1, p + 3, 0, 3)
    assert verdict.committed([]) == want[3:6] and not session.ahead
    with pytest.raises(Exception, match="finished"):
        session.verify_chain([PendingBlock(1, p + 3, want[3:6])])


@pytest.mark.parametrize("why", ["not asked", "rejection mode", "stale blocks dropped", "held full", "done"])
def test_no_decoding_ahead_where_it_may_not(tiny_engine, greedy_path, why):
    """Only for an edge that asked (``Open.takes_ahead``), in greedy and coupled modes (in rejection mode the
    token is sampled apart from the edge's guess), where the service decodes for stale blocks, within what
    one verdict may carry, and while the session goes on."""
    prompt, want = greedy_path
    params = SamplingParams(mode=Mode.REJECTION, temperature=1.0, seed=1) if why == "rejection mode" else GREEDY
    session = new_session(tiny_engine, prompt, params=params, decode_ahead=why != "not asked",
                          decode_stale=why != "stale blocks dropped")
    if why == "held full":
        session.ahead.tokens = [0] * (session.draft_limit.opened - session.drafts_at_no_cost())
    if why == "done":
        session.done = True
    assert not decodes_ahead(session, deadline=None)


def test_a_forward_that_would_delay_the_next_block_waits(tiny_engine, greedy_path):
    """As a stale decode: a forward that would still run when the edge's block is due starts only where its
    overrun pays (``stale_decode_overrun_pays``), here never: the guesses are sure to hold."""
    prompt, want = greedy_path
    session = _corrected(tiny_engine, prompt, want)
    _ahead(session, 1)  # (measures the forward)
    session.stats.drafted_at, session.stats.accepted_at = [1000], [1000]  # the edge's guesses always hold
    assert not decodes_ahead(session, deadline=time.perf_counter())
    assert decodes_ahead(session, deadline=time.perf_counter() + 60)


def test_chain_start_guesses_count_trials_from_where_the_edge_was_told():
    """Hits up to the first miss, that miss, nothing past it or past the committed tokens; a block that
    starts before the told position (its first drafts guessed stale decodes) counts from there, and a miss
    before it is a miss at the first position."""
    tokens = [9, 9, 1, 2, 3, 4, 5]  # committed, two of them the prompt's
    guesses = ChainStartGuesses()
    guesses.observe([1, 2, 7, 4], 2, 2, tokens)  # hit, hit, miss
    guesses.observe([1, 2, 3, 4, 5, 6, 7], 2, 2, tokens)  # hits through the committed tokens only
    guesses.observe([1, 2, 3, 8], 2, 4, tokens)  # from position 4: hit, miss
    guesses.observe([8, 2, 3], 2, 3, tokens)  # wrong before the told position
    guesses.observe([3, 4], 4, 2, tokens)  # past the told position: no trial
    assert guesses.trials == [4, 3, 2, 1, 1] and guesses.hits == [3, 2, 1, 1, 1]
    assert guesses.held(0) == pytest.approx(4 / 6) and guesses.held(1) == pytest.approx(4 / 6 * 3 / 5)


@pytest.mark.parametrize("edge", ["guesses hold", "guesses miss", "not known"])
def test_decoding_ahead_pays_where_the_edge_s_new_chains_would_miss_the_tokens(tiny_engine, greedy_path, edge):
    """A token decoded ahead that the edge's next block holds costs a forward and tells the edge nothing
    sooner: a session whose edge's new chains always guessed right stops decoding ahead, one whose edge's
    chains missed goes on, and one that has seen none decodes ahead (the first token is as likely held as
    missed, the later ones likelier missed)."""
    prompt, want = greedy_path
    session = _corrected(tiny_engine, prompt, want)
    room = session.draft_limit.opened - session.drafts_at_no_cost()
    for _ in range(0 if edge == "not known" else 20):
        drafts = want[: room] if edge == "guesses hold" else [(want[0] + 1) % tiny_engine.vocab_size]
        session.ahead.guesses.observe(drafts, len(prompt), len(prompt), [*prompt, *want])
    assert decodes_ahead(session, deadline=None) == (edge != "guesses hold")
    assert ChainStartGuesses().pays(0, 1)  # (a tie: as likely missed as held)


def test_an_edge_that_takes_the_end_unasked_gets_the_last_tokens_decoded_ahead_where_they_fit(tiny_engine,
                                                                                                greedy_path):
    """Where the edge's new chains hold the tokens, decoding ahead does not pay (the control); but where the
    tokens left to the limit fit before the edge's next block is due, an edge that takes the final verdict
    unasked learns them all as soon as they are decoded, sooner than any block could tell it: they are
    decoded. Not where they do not fit."""
    prompt, want = greedy_path
    for tell_end, left, deadline_s in ((False, 4, 60.0), (True, 4, 60.0), (True, 60, 60.0), (True, 4, 0.0)):
        session = _corrected(tiny_engine, prompt, want, tell_end=tell_end, max_new_tokens=3 + left)
        room = session.draft_limit.opened - session.drafts_at_no_cost()
        for _ in range(20):
            session.ahead.guesses.observe(want[:room], len(prompt), len(prompt), [*prompt, *want])
        session.one_token_s.add(1.0)
        decodes = decodes_ahead(session, deadline=time.perf_counter() + deadline_s)
        assert decodes == (tell_end and left <= room and deadline_s > 1.0), (tell_end, left, deadline_s)


def test_the_ledger_counts_no_draft_for_a_token_decoded_ahead():
    """Fair share's acceptance: tokens decoded ahead are credited to the client as committed when told, never
    as accepted drafts (the forward that told them did not feed them)."""
    told = Verdict(1, 10, 4, 7, False, False, ahead=2)  # 2 drafts matched tokens decoded ahead, 2 verified
    stale = Verdict(1, 10, 0, 7, True, False, stale=True, rebased=(5, 6), rebased_verified=3, ahead=2)
    step = StepResult([told], rows=3, drafts=2)
    assert step.drafts_accepted == 2 and step.client_tokens == 5
    assert StepResult([stale], rows=1).drafts_accepted == 0 and StepResult([stale], rows=1).client_tokens == 3


def test_a_verdict_carrying_tokens_decoded_ahead_verifies_no_more_than_a_block_may_hold(tiny_engine, greedy_path,
                                                                                     monkeypatch):
    """The tokens held ride in front of the next verdict's own verified drafts (a stale decode's spare drafts,
    an empty block's proposals), and the edge refuses a verdict that verified more than its blocks may hold
    (``edge.verdict_checks``): the drafts a forward verifies for free stop where the two would pass it,
    even where the forward's free rows grew since the tokens were decoded (CI's edge refused "5 rebased
    drafts of 6 verified, at most 5")."""
    prompt, want = greedy_path
    p = len(prompt)
    rows = {"at cost of one": 3}
    monkeypatch.setattr(tiny_engine, "rows_at_cost_of", lambda _rows, _reproducible=False: rows["at cost of one"])
    session = VerifierSession(tiny_engine, prompt, GREEDY, max_new_tokens=64, max_draft_len=5,
                              policy=SessionPolicy(decode_ahead=True, propose=True))
    wrong = (want[2] + 1) % tiny_engine.vocab_size
    session.verify_chain([PendingBlock(0, p, [want[0], want[1], wrong, want[3]])])
    while decodes_ahead(session, deadline=None):
        run_alone(decode_ahead_steps(session), session.engine)
    held = len(session.ahead)
    assert held == 3  # the Open's 5 less the 2 drafts a forward verified for free then
    rows["at cost of one"] = 5  # 4 free now
    session._spare.add(p + 3 + held, want[3 + held:3 + held + 4])  # drafts the edge sent past the tokens held
    other = (want[3] + 1) % tiny_engine.vocab_size
    (verdict,) = session.verify_chain([PendingBlock(1, p + 3, [other, *want[4:8]])])  # stale: guessed them wrong
    assert verdict.ahead == held and verdict.stale
    assert verdict.rebased_verified <= session.draft_limit.opened
    assert verdict.committed([])[:held] == want[3:3 + held] and session.tokens[p:] == want[: len(session.tokens) - p]
