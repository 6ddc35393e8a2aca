"""Reproducibility per session (``--shapes auto``): a forward runs canonical shapes only when one of its
sessions asked for it; a reproducible session's logits and tokens are bit-identical to reproducible
target-only decoding beside any batch-mates, and a lone session that did not ask runs unpadded."""

from __future__ import annotations

import random
import threading

import pytest
import torch
from helpers import link_for, tiny_drafter, tiny_prompt

from cloud.engine import ForwardItem, TargetEngine
from cloud.limits import ServiceLimits
from cloud.server import BackgroundServer, ServerConfig
from edge.decode_loop import run_decode
from edge.schedule import SpecConfig
from edge.verifier_protocol import VerifierError
from shared.params import Mode, SamplingParams
from sim.bench.invariance import one_at_a_time
from sim.inprocess import generate


@pytest.fixture(scope="module")
def auto_engine(tiny_models):
    return TargetEngine(tiny_models["target"], shapes="auto")


@pytest.fixture(scope="module")
def free_engine(tiny_models):
    return TargetEngine(tiny_models["target"], shapes="free")


def _beside_free_mates(engine, tokens, start, rng):
    """``tokens``' rows from ``start`` on, decoded as a reproducible session in blocks of 1-4, every
    forward shared with batch-mates that are not reproducible."""
    mates = [engine.new_sequence() for _ in range(2)]
    for mate in mates:
        engine.forward(mate, [rng.randrange(3, 400) for _ in range(rng.randrange(5, 60))], last_only=True)
    seq = engine.new_sequence()
    first = engine.forward_batch([ForwardItem(seq, tokens[:start], "last", reproducible=True),
                                  ForwardItem(mates[0], [9])])[0]
    rows = [first[-1]]
    while len(rows) < len(tokens) - start:
        position = start + len(rows) - 1
        block = tokens[position : position + rng.randrange(1, 5)]
        out = engine.forward_batch([ForwardItem(seq, block, reproducible=True),
                                    *[ForwardItem(m, [rng.randrange(3, 400)]) for m in mates]])
        rows.extend(out[0])
    return torch.stack(rows[: len(tokens) - start])


def test_reproducible_rows_are_bit_identical_beside_free_batch_mates(auto_engine, tiny_engine):
    rng = random.Random(11)
    tokens = [1] + [rng.randrange(3, 500) for _ in range(90)]
    want = one_at_a_time(tiny_engine, tokens, 30)  # canonical shapes throughout: reproducible target-only
    assert torch.equal(_beside_free_mates(auto_engine, tokens, 30, rng), want)
    # The control: the same rows decoded without asking (free shapes) differ in the last bits.
    assert not torch.equal(one_at_a_time(auto_engine, tokens, 30), want)


def test_a_lone_session_that_is_not_reproducible_runs_unpadded(auto_engine, free_engine, tiny_engine):
    seq = auto_engine.new_sequence()
    lone, asked = [ForwardItem(seq, [5])], [ForwardItem(seq, [5], reproducible=True)]
    assert auto_engine.padding_for(lone) is None and auto_engine.padding_for(asked) is auto_engine.padding
    assert auto_engine.rows_at_cost_of(1) == 1 < auto_engine.rows_at_cost_of(1, reproducible=True)
    assert tiny_engine.padding_for(lone) is tiny_engine.padding  # --shapes canonical pads every forward
    rng = random.Random(2)
    tokens = [1] + [rng.randrange(3, 500) for _ in range(40)]
    # Unpadded: the same bits as an engine that never pads.
    assert torch.equal(one_at_a_time(auto_engine, tokens, 10), one_at_a_time(free_engine, tokens, 10))


def test_a_reproducible_split_session_beside_others_is_token_identical(tiny_models, tiny_vocab, auto_engine,
                                                                       tiny_engine):
    """Coupled split decoding of a reproducible session on an auto verifier, while another session that is
    not reproducible decodes beside it, gives reproducible target-only decoding's tokens."""
    params = SamplingParams(mode=Mode.COUPLED, temperature=0.9, seed=3, reproducible=True)
    prompt = tiny_prompt(tiny_engine, "The cat sat on the mat.")
    limits = ServiceLimits(max_draft_len=16, session_ttl_s=30)
    drafter, other_drafter = tiny_drafter(tiny_models), tiny_drafter(tiny_models, "drafter_f32")
    try:
        want = generate(tiny_engine, drafter, prompt, params, max_new_tokens=40, spec=SpecConfig(0))
        with BackgroundServer(auto_engine, ServerConfig(port=0, limits=limits)) as server:
            other = SamplingParams(mode=Mode.COUPLED, temperature=0.9, seed=8)
            mate_result = []  # the batch-mate's generation, once it has finished (a mate that failed leaves none)
            mate = threading.Thread(target=lambda: mate_result.append(run_decode(
                other_drafter, link_for(server, tiny_vocab), tiny_prompt(tiny_engine, "We have 3 dogs"), other,
                max_new_tokens=40, spec=SpecConfig(4, window=2))))
            mate.start()
            got = run_decode(drafter, link_for(server, tiny_vocab), prompt, params, max_new_tokens=40,
                             spec=SpecConfig(4, window=2))
            mate.join(timeout=120)
        assert got.tokens == want.tokens
        assert len(mate_result) == 1 and len(mate_result[0].tokens) == 40  # it did decode beside the session
    finally:
        drafter.close()
        other_drafter.close()


def test_a_free_shapes_verifier_refuses_a_reproducible_session(tiny_models, tiny_vocab, free_engine, tiny_engine):
    drafter = tiny_drafter(tiny_models)
    try:
        with BackgroundServer(free_engine, ServerConfig(port=0)) as server:
            params = SamplingParams(mode=Mode.GREEDY, reproducible=True)
            with pytest.raises(VerifierError, match="cannot serve a reproducible session: it runs free shapes") as err:
                run_decode(drafter, link_for(server, tiny_vocab), tiny_prompt(tiny_engine, "Hi"), params,
                           max_new_tokens=8, spec=SpecConfig(3))
            assert err.value.bad_input  # a refusal of the request: exit 2 on the command line
            # The same session without reproducible numerics is served.
            fine = run_decode(drafter, link_for(server, tiny_vocab), tiny_prompt(tiny_engine, "Hi"),
                              SamplingParams(mode=Mode.GREEDY), max_new_tokens=8, spec=SpecConfig(3))
            assert len(fine.tokens) == 8
    finally:
        drafter.close()


def test_the_verifier_says_its_row_tile_and_each_forward_s_rows(tiny_vocab, auto_engine, tiny_engine):
    """``Opened.row_tile``: the rows a forward of the session costs alike (its products' tile where it is
    reproducible, 1 where it runs free); ``Verdict.forward_rows``: the session's rows in the forward that
    answered a block (the token the cache lacks and the drafts), for the edge's row-cost curve."""
    from edge.drafter import DraftBlock

    prompt = tiny_prompt(tiny_engine, "The cat sat on the mat.")
    with BackgroundServer(auto_engine, ServerConfig(port=0)) as server:
        for reproducible in (False, True):
            link = link_for(server, tiny_vocab)
            try:
                terms = link.open(prompt, SamplingParams(mode=Mode.GREEDY, reproducible=reproducible),
                                  max_new_tokens=16, max_draft_len=4)
                assert terms.row_tile == auto_engine.rows_at_cost_of(1, reproducible)
                first = link.receive().verdict  # the first position, with the Opened: no forward of its own
                drafts = [7, 8, 9]
                link.send(first.epoch, len(prompt) + 1, DraftBlock(drafts), more_follows=False)
                received = link.receive()
                verdict, timing = received.verdict, received.timing
                assert verdict.start_position == len(prompt) + 1 and not verdict.stale  # answered, verified
                assert timing.forward_rows == 1 + len(drafts) and timing.forward_s > 0
            finally:
                link.close()
    assert auto_engine.rows_at_cost_of(1, True) > 1  # (the tile differs between the two sessions)
