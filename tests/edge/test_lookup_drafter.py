"""Prompt lookup first, the model for the rest: what each source is credited with, when the lookup
is used, and that output stays the target's (in process and over gRPC, rejection mode's audit too)."""

from __future__ import annotations

import pytest
from helpers import GREEDY, greedy_continuation, rejection_sampling, tiny_drafter, tiny_prompt

from edge.drafter import ModelFreeDrafter, one_hot_block
from edge.lookup_drafter import LookupFirstDrafter
from edge.schedule import SpecConfig
from shared.lookup import lookup_continuation
from shared.params import Mode, SamplingParams
from shared.verdict import StopReason

REPEATS = "the cat sat on the mat. the cat sat on the mat. the cat"


class Constant(ModelFreeDrafter):
    """A model that always proposes ``token``."""

    def __init__(self, token: int) -> None:
        super().__init__(64)
        self.token = token

    def propose_block(self, n):
        return one_hot_block([self.token] * n, self._params)


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
    drafter.commit([3, 5])  # the lookup's second proposal was wrong: one accepted, one rejected, the rest void
    assert (drafter.acceptance["lookup"].proposed, drafter.acceptance["lookup"].accepted) == (2, 1)
    assert drafter.sequence == [1, 2, 3, 4, 1, 2, 3, 5]
    block = drafter.draft(3)  # no earlier [3, 5], and one token is too short a match: the model drafts
    assert block.tokens == [9, 9, 9]
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
        # (free shapes' product paths are timed at load, so the rounding, and with it the sample, may differ
        # between runs: the target may end its answer before the limit)
        assert len(got.tokens) == 40 or got.stop_reason is StopReason.EOS and len(got.tokens) < 40
        return
    assert got.tokens == want
    if params.mode is Mode.GREEDY:
        assert want == greedy_continuation(tiny_engine, prompt)
