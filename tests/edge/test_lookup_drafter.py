"""Prompt lookup first, the model for the rest: what each source is credited with, when the lookup
is used, and that output stays the target's (in process and over gRPC, rejection mode's audit too)."""

from __future__ import annotations

import time

import pytest
from helpers import GREEDY, greedy_continuation, rejection_sampling, tiny_drafter, tiny_prompt

from edge.drafter import ModelFreeDrafter, one_hot_block
from edge.lookup_drafter import LookupFirstDrafter
from edge.schedule import SpecConfig
from shared.lookup import lookup_continuation
from shared.params import Mode, SamplingParams
from shared.stats import Ewma

REPEATS = "the cat sat on the mat. the cat sat on the mat. the cat"
LOOPS = "the the the the the"  # the tiny target's greedy continuation falls into a loop: lookups hit


class Constant(ModelFreeDrafter):
    """A model that always proposes ``token``, in ``token_s`` seconds a token."""

    def __init__(self, token: int, vocab_size: int = 64, token_s: float = 0.0) -> None:
        super().__init__(vocab_size)
        self.token, self.token_s = token, token_s

    def propose_block(self, n):
        time.sleep(self.token_s * n)
        return one_hot_block([self.token] * n, self._params)


def test_a_block_counts_the_drafts_a_lookup_supplied():
    drafter = LookupFirstDrafter(Constant(9))
    drafter.begin([1, 2, 3, 1, 2], GREEDY)
    block = drafter.draft(4)  # the lookup has [1, 2] -> [3, 1, 2] and no more: the model drafts the last
    assert block.tokens == [3, 1, 2, 9] and (block.looked_up, block.paid_drafts) == (3, 1)
    assert (block.first(2).looked_up, block.first(4).looked_up) == (2, 3)
    assert block.then(one_hot_block([9, 9], GREEDY)).paid_drafts == 3
    assert block.then(block).looked_up == 6


def test_lookup_continuation_takes_the_longest_latest_match():
    seq = [1, 2, 3, 9, 5, 2, 3, 7, 8, 2, 3]
    assert lookup_continuation(seq, 2, max_ngram=3, min_ngram=2) == [7, 8]  # [2, 3] latest: before 7
    assert lookup_continuation([4, 1, 2, 3, 5, 6, 1, 2, 3], 4, 3, 1) == [5, 6, 1, 2]  # [1, 2, 3]
    assert lookup_continuation([1, 2, 3], 4, 3, 2) == [] and lookup_continuation([1, 2, 1], 0, 3, 1) == []


def test_each_source_is_credited_as_a_block_is_verified():
    drafter = LookupFirstDrafter(Constant(9))
    drafter.begin([1, 2, 3, 4, 1, 2], GREEDY)
    block = drafter.draft(4)  # the lookup has [1, 2] -> [3, 4, 1, 2]; untried, it is used; the model fills none
    assert block.tokens == [3, 4, 1, 2] and drafter.looked_up == 4 and block.runner_up == [None] * 4
    assert (block.looked_up, block.paid_drafts) == (4, 0)  # no drafter ran: its time prices nothing
    drafter.commit([3, 5])  # the lookup's second proposal was wrong: one accepted, one rejected, the rest void
    assert (drafter.acceptance["lookup"].proposed, drafter.acceptance["lookup"].accepted) == (2, 1)
    assert drafter.sequence == [1, 2, 3, 4, 1, 2, 3, 5]
    block = drafter.draft(3)  # no earlier [3, 5], and one token is too short a match: the model drafts
    assert block.tokens == [9, 9, 9] and (block.looked_up, block.paid_drafts) == (0, 3)
    drafter.commit([9, 9, 7])
    drafter.commit(drafter.draft(2).tokens)  # [9, 7] never occurred before: the model's [9, 9], both right
    assert (drafter.acceptance["model"].proposed, drafter.acceptance["model"].accepted) == (5, 4)
    assert not drafter.lookup_pays  # 2/4 against 5/7 (one of each before any)
    block = drafter.draft(3)  # [9, 9] was followed by [7, 9, 9]: only a shadow now, the model drafts
    assert block.tokens == [9, 9, 9] and drafter.looked_up == 4
    drafter.commit([7, 9, 9])
    assert (drafter.acceptance["lookup"].proposed, drafter.acceptance["lookup"].accepted) == (5, 4)
    assert (drafter.acceptance["model"].proposed, drafter.acceptance["model"].accepted) == (6, 4)
    assert drafter.lookup_pays  # the shadow's 5/7 against 5/8: the lookup wins back
    with pytest.raises(ValueError, match="min_ngram"):
        LookupFirstDrafter(Constant(9), min_ngram=0)


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(mode=Mode.COUPLED, temperature=0.8, seed=3),
                                    rejection_sampling(seed=5, temperature=0.8)], ids=lambda p: p.mode.value)
def test_output_is_the_targets_over_grpc_with_the_lookup_used(verifier, tiny_engine, tiny_models, params):
    from edge.decode_loop import run_decode
    from edge.endpoint import VerifierEndpoint
    from edge.grpc_verifier import GrpcVerifier
    from sim.inprocess import generate

    prompt = tiny_prompt(tiny_engine, REPEATS)
    drafter = LookupFirstDrafter(tiny_drafter(tiny_models))
    try:
        want = generate(tiny_engine, drafter.model, prompt, params, max_new_tokens=40, spec=SpecConfig(0)).tokens
        connection = GrpcVerifier(VerifierEndpoint(verifier.address, tiny_engine.vocab_size, tiny_engine.fingerprint))
        connection.connect()
        got = run_decode(drafter, connection, prompt, params, max_new_tokens=40, spec=SpecConfig(6, window=3))
    finally:
        drafter.close()
    assert drafter.looked_up > 0
    if params.mode is Mode.REJECTION:  # exact in distribution, not token for token; the audit passes its drafts
        assert len(got.tokens) == 40
        return
    assert got.tokens == want
    if params.mode is Mode.GREEDY:
        assert want == greedy_continuation(tiny_engine, prompt)


class _Samples(Ewma):
    """An ``Ewma`` that keeps every sample."""

    def __init__(self) -> None:
        super().__init__()
        self.samples: list[float] = []

    def add(self, sample: float) -> None:
        self.samples.append(sample)
        super().add(sample)


def test_the_controller_learns_the_drafters_cost_apart_from_the_lookups(verifier, tiny_engine):
    """Looked-up drafts cost nothing: the controller's price of a drafted token over the drafts a drafter
    ran for takes every sample at the drafter's own cost, whether a block's drafts were looked up in
    part, in whole or not at all, while the mixture over every draft sees the free ones; and the
    controller knows whether the lookup leads the drafter's blocks (``edge.draft_cost``)."""
    from edge.controller import Controller
    from edge.decode_loop import run_decode
    from edge.endpoint import VerifierEndpoint
    from edge.grpc_verifier import GrpcVerifier

    token_s = 0.01
    prompt = tiny_prompt(tiny_engine, LOOPS)
    drafter = LookupFirstDrafter(Constant(prompt[-1], tiny_engine.vocab_size, token_s))
    controller = Controller(6, 3, 16)
    cost = controller.draft_s_per_token
    cost.drafter_only, cost.every_draft = drafter_only, every_draft = _Samples(), _Samples()
    connection = GrpcVerifier(VerifierEndpoint(verifier.address, tiny_engine.vocab_size, tiny_engine.fingerprint))
    connection.connect()
    run_decode(drafter, connection, prompt, GREEDY, max_new_tokens=40, spec=SpecConfig(6, window=3, controller=controller))
    assert drafter.looked_up >= 8 and len(drafter_only.samples) >= 2  # (the lookup supplied whole blocks; so did the drafter)
    assert min(drafter_only.samples) >= 0.8 * token_s
    assert min(every_draft.samples) < 0.1 * token_s  # a block the lookup supplied, seen at its cost
    assert cost.lookup_leads == drafter.lookup_pays
