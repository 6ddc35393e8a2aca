"""Multi-turn conversations: a session kept between turns uploads only what each turn adds, and
the output equals a fresh session given the whole history (tiny models, real gRPC server)."""

from __future__ import annotations

import pytest
from helpers import tiny_drafter, tiny_prompt

from cloud.limits import ServiceLimits
from edge.conversation import Conversation
from edge.decode_loop import run_decode
from edge.endpoint import VerifierEndpoint
from edge.schedule import SpecConfig
from shared.params import Mode, SamplingParams
from sim.inprocess import generate

PARAMS = [SamplingParams(mode=Mode.GREEDY), SamplingParams(mode=Mode.COUPLED, temperature=0.9, seed=4)]
TURNS = ["The cat sat on the mat.", " Then the dog came in.", " We have 3 dogs and 12 cats!", " It was late."]


@pytest.fixture(scope="module")
def drafter(tiny_models):
    made = tiny_drafter(tiny_models, "drafter_noisy", n_ctx=1024)
    yield made
    made.close()


@pytest.fixture()
def server(serve):
    return serve(ServiceLimits(max_draft_len=16))


def words(engine, text: str) -> list[int]:
    return engine.tokenizer(text, add_special_tokens=False).input_ids


def run_turn(conversation, server, engine, drafter, prompt, params):
    verifier = conversation.verifier(VerifierEndpoint(server.address, engine.vocab_size, engine.fingerprint))
    result = run_decode(drafter, verifier, prompt, params, max_new_tokens=12, spec=SpecConfig(4, window=2))
    conversation.record(verifier, prompt, result.tokens)
    return result, verifier


@pytest.mark.parametrize("params", PARAMS, ids=lambda p: p.mode.value)
def test_each_turn_uploads_only_its_own_tokens_and_matches_a_fresh_session(tiny_engine, drafter, server, params):
    conversation = Conversation()
    history = tiny_prompt(tiny_engine, TURNS[0])
    for turn, text in enumerate(TURNS):
        if turn:
            history = [*history, *words(tiny_engine, text)]
        result, verifier = run_turn(conversation, server, tiny_engine, drafter, history, params)
        fresh = generate(tiny_engine, drafter, history, params, max_new_tokens=12, spec=SpecConfig(0))
        assert result.tokens == fresh.tokens, turn
        new = len(history) if turn == 0 else len(words(tiny_engine, text))
        assert verifier.prompt_tokens_sent == new, (turn, verifier.prompt_tokens_sent, new)
        history = [*history, *result.tokens]
    assert len(server.server.servicer.table) == 1  # one session carried the whole conversation


def test_a_re_rendered_history_keeps_only_the_shared_prefix(tiny_engine, drafter, server):
    """Templates may rewrite earlier turns: what differs is sent again, never assumed."""
    params = PARAMS[1]
    conversation = Conversation()
    first = tiny_prompt(tiny_engine, TURNS[0] + TURNS[1])
    result, _ = run_turn(conversation, server, tiny_engine, drafter, first, params)
    edited = [*first[:4], *words(tiny_engine, " dog"), *first[4:], *result.tokens, *words(tiny_engine, TURNS[2])]
    second, verifier = run_turn(conversation, server, tiny_engine, drafter, edited, params)
    assert second.tokens == generate(tiny_engine, drafter, edited, params, max_new_tokens=12, spec=SpecConfig(0)).tokens
    assert verifier.prompt_tokens_sent == len(edited) - 4


def test_a_lost_session_is_reopened_on_the_whole_prompt(tiny_engine, drafter, server):
    params = PARAMS[0]
    conversation = Conversation()
    history = tiny_prompt(tiny_engine, TURNS[0])
    result, _ = run_turn(conversation, server, tiny_engine, drafter, history, params)
    server.server.servicer.table.remove(next(iter(server.server.servicer.table._by_ticket.values())))
    history = [*history, *result.tokens, *words(tiny_engine, TURNS[1])]
    second, verifier = run_turn(conversation, server, tiny_engine, drafter, history, params)
    assert second.tokens == generate(tiny_engine, drafter, history, params, max_new_tokens=12,
                                     spec=SpecConfig(0)).tokens
    assert verifier.prompt_tokens_sent == len(history)


def test_a_next_turn_names_its_replica_and_a_misrouted_one_is_counted(serve, tiny_engine, drafter):
    limits = ServiceLimits(max_draft_len=16)
    server = serve(limits, replica="r1")
    metrics = server.server.servicer.metrics
    conversation = Conversation()
    history = tiny_prompt(tiny_engine, TURNS[0])
    result, _ = run_turn(conversation, server, tiny_engine, drafter, history, PARAMS[0])
    assert conversation.replica == "r1"
    history = [*history, *result.tokens, *words(tiny_engine, TURNS[1])]
    run_turn(conversation, server, tiny_engine, drafter, history, PARAMS[0])  # names r1: routed right
    assert metrics.registry.get_sample_value("splitspec_misrouted_streams_total") == 0
    conversation.replica = "r2"  # as if a proxy had sent a turn for r2 here
    history = [*history, *words(tiny_engine, TURNS[2])]
    result, verifier = run_turn(conversation, server, tiny_engine, drafter, history, PARAMS[0])
    assert metrics.registry.get_sample_value("splitspec_misrouted_streams_total") == 1 and verifier.served_by.replica == "r1"
    fresh = generate(tiny_engine, drafter, history, PARAMS[0], max_new_tokens=12, spec=SpecConfig(0))
    assert result.tokens == fresh.tokens
