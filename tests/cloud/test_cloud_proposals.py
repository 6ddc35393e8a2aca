"""Drafts the cloud proposes itself while it decodes alone (``VerifierSession._proposals``): prompt
lookup over the committed tokens, in the rows its forward holds for the cost of the token alone. They
are verified like any draft, so the tokens are the target's alone; a verifier whose every row costs
(free shapes on a CPU) proposes nothing."""

from __future__ import annotations

import pytest
from helpers import link_for, tiny_drafter, tiny_prompt

from cloud.engine import TargetEngine
from cloud.limits import ServiceLimits
from cloud.server import BackgroundServer, ServerConfig
from cloud.session import SessionPolicy, VerifierSession
from edge.controller import Controller, Plan
from edge.decode_loop import run_decode
from edge.schedule import SpecConfig
from shared.params import Mode, SamplingParams

# The tiny target's (random) continuations of this prompt repeat a few of their own bigrams, and
# what followed one of them the first time follows it again now and then (greedy, seed 2 coupled):
# where the cloud's lookup proposals get accepted.
TEXT = "We have 3 dogs and 12 cats!"
N = 80


def _alone(engine, prompt, params, n, propose=True):
    """``n`` tokens of the cloud decoding alone (an empty block at a time), for an edge that takes the
    cloud's proposals (``propose``) or not: (tokens, session)."""
    session = VerifierSession(engine, prompt, params, max_new_tokens=n, max_draft_len=8,
                              policy=SessionPolicy(propose=propose))
    tokens = []
    while not session.done:
        tokens.extend(session.verify(session.epoch, len(prompt) + len(tokens), []).committed([]))
    return tokens, session


@pytest.mark.parametrize("mode", [Mode.GREEDY, Mode.COUPLED])
def test_the_cloud_s_own_proposals_ride_in_free_rows_and_change_no_token(tiny_engine, mode):
    params = SamplingParams(mode=mode, temperature=0.0 if mode is Mode.GREEDY else 0.9, seed=2, reproducible=True)
    prompt = tiny_prompt(tiny_engine, TEXT)
    tile = tiny_engine.rows_at_cost_of(1, reproducible=True)
    assert tile > 1  # (rows that cost nothing: where the proposals go)
    got, session = _alone(tiny_engine, prompt, params, N)
    want, plain = _alone(tiny_engine, prompt, params, N, propose=False)  # the control: no proposals
    assert plain.stats.proposed == 0 and plain.forwards == len(want)  # the prefill, then a forward a token past the first
    assert got == want and len(got) == N
    assert 0 < session.stats.proposed_accepted <= session.stats.proposed
    assert session.forwards < plain.forwards  # tokens that cost no forward of their own
    assert session.stats.generated == N


def test_a_verifier_whose_every_row_costs_proposes_nothing(tiny_models, tiny_engine):
    free = TargetEngine(tiny_models["target"], shapes="free")
    assert free.rows_at_cost_of(1) == 1
    _, session = _alone(free, tiny_prompt(tiny_engine, TEXT), SamplingParams(mode=Mode.GREEDY), 24)
    assert session.stats.proposed == 0
    # Rejection mode: a proposal has no q̃ to verify against: none either.
    params = SamplingParams(mode=Mode.REJECTION, temperature=0.9, seed=1, reproducible=True)
    _, session = _alone(tiny_engine, tiny_prompt(tiny_engine, TEXT), params, 24)
    assert session.stats.proposed == 0


class CloudAlone(Controller):
    """The cloud decodes alone throughout: empty blocks, 8 in flight."""

    def __init__(self) -> None:
        super().__init__(max_draft_len=4, window=2, cloud_window=8)

    def plan(self, drafting_only=False, tokens_left=None):
        return Plan(0, self.cloud_window, None)


def test_an_edge_takes_the_cloud_s_proposals_over_grpc_token_identically(tiny_models, tiny_vocab, tiny_engine):
    """Empty blocks in flight over a real link: verdicts bring the proposals before their token; the
    edge commits them, later empty blocks ask for the next token wherever it now is, and the output is
    the target's, to the token limit."""
    params = SamplingParams(mode=Mode.COUPLED, temperature=0.9, seed=2, reproducible=True)
    prompt = tiny_prompt(tiny_engine, TEXT)
    want, _ = _alone(tiny_engine, prompt, params, N, propose=False)
    drafter = tiny_drafter(tiny_models)
    try:
        with BackgroundServer(tiny_engine, ServerConfig(port=0, limits=ServiceLimits(session_ttl_s=30))) as server:
            got = run_decode(drafter, link_for(server, tiny_vocab), prompt, params, max_new_tokens=N,
                             spec=SpecConfig(4, window=2, controller=CloudAlone()))
    finally:
        drafter.close()
    assert got.tokens == want
    assert got.stats.proposed_accepted > 0 and got.stats.rounds < N


def test_an_edge_that_drafts_nothing_is_proposed_nothing(tiny_models, tiny_vocab, tiny_engine):
    """An edge that opens with no drafts per block (target-only decoding over the split protocol) does
    not ask for proposals (``Open.takes_proposals``): it would refuse drafts it never allowed."""
    params = SamplingParams(mode=Mode.GREEDY, reproducible=True)
    prompt = tiny_prompt(tiny_engine, TEXT)
    want, _ = _alone(tiny_engine, prompt, params, N, propose=False)
    drafter = tiny_drafter(tiny_models)
    try:
        with BackgroundServer(tiny_engine, ServerConfig(port=0, limits=ServiceLimits(session_ttl_s=30))) as server:
            got = run_decode(drafter, link_for(server, tiny_vocab), prompt, params, max_new_tokens=N,
                             spec=SpecConfig(0))
    finally:
        drafter.close()
    assert got.tokens == want and got.stats.proposed == 0


def test_a_conversation_s_next_turn_asks_for_proposals_afresh(tiny_models, tiny_vocab, tiny_engine):
    """A turn that drafts, then one that drafts nothing, on the same cloud session: the second turn's Open
    says it takes no proposals, and the cloud stops proposing (else the edge would refuse the verdict)."""
    from edge.conversation import Conversation
    from edge.endpoint import VerifierEndpoint

    params = SamplingParams(mode=Mode.GREEDY, reproducible=True)
    conversation, history = Conversation(), tiny_prompt(tiny_engine, TEXT)
    drafter = tiny_drafter(tiny_models, n_ctx=1024)
    try:
        with BackgroundServer(tiny_engine, ServerConfig(port=0, limits=ServiceLimits(session_ttl_s=30))) as server:
            for draft_len in (4, 0):
                verifier = conversation.verifier(VerifierEndpoint(server.address, *tiny_vocab))
                result = run_decode(drafter, verifier, history, params, max_new_tokens=N,
                                    spec=SpecConfig(draft_len, controller=CloudAlone() if draft_len else None))
                conversation.record(verifier, history, result.tokens)
                want, _ = _alone(tiny_engine, history, params, N, propose=False)
                assert result.tokens == want, draft_len
                if draft_len:
                    assert result.stats.proposed > 0  # (the first turn took proposals)
                else:
                    _, control = _alone(tiny_engine, history, params, N)  # a session that proposes does, here
                    assert control.stats.proposed > 0 and result.stats.proposed == 0
                history = [*history, *result.tokens, *tiny_prompt(tiny_engine, TEXT)[1:]]
            assert len(server.server.servicer.table) == 1  # one session carried both turns
    finally:
        drafter.close()
