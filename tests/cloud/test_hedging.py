"""Hedge branches: the tree forward, the verdicts that take a branch, and identity with target-only decoding."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import torch
from helpers import ScriptedDrafter, greedy_continuation, tiny_drafter, tiny_prompt

from cloud.engine import ForwardItem
from cloud.session import BlockRejected, PendingBlock, SessionPolicy, VerifierSession
from edge.decode_loop import run_decode
from edge.drafter import DraftBlock, Speculation
from edge.endpoint import VerifierEndpoint
from edge.grpc_verifier import GrpcVerifier
from edge.hedging import hedge
from edge.schedule import SpecConfig
from protos import splitspec_pb2 as pb
from protos import splitspec_pb2_grpc as pb_grpc
from shared import codec
from shared.params import Mode, SamplingParams
from shared.sparse import SparseDist
from shared.verdict import StopReason
from shared.wire import sampling_to_proto
from sim.inprocess import generate

GREEDY = SamplingParams(mode=Mode.GREEDY)
TEXT = "The cat sat on the mat and looked at the"


@pytest.fixture(scope="module")
def greedy_path(tiny_engine):
    """A prompt and the target's own greedy continuation of it (40 tokens)."""
    prompt = tiny_prompt(tiny_engine, TEXT)
    return prompt, greedy_continuation(tiny_engine, prompt)


# ---------------------------------------------------------------- the tree forward


def test_branch_rows_equal_the_same_tokens_decoded_on_their_path_alone(tiny_engine):
    """A branch's logits are bit-identical to its path decoded alone, and after adopting it the
    sequence continues exactly as that path would."""
    engine = tiny_engine
    prompt = tiny_prompt(engine, TEXT)
    gen = torch.Generator().manual_seed(3)
    main = torch.randint(3, engine.vocab_size, (6,), generator=gen).tolist()
    branch_a = torch.randint(3, engine.vocab_size, (3,), generator=gen).tolist()
    branch_b = torch.randint(3, engine.vocab_size, (2,), generator=gen).tolist()
    p = len(prompt)
    tree = engine.new_sequence()
    engine.forward(tree, prompt)
    out = engine.forward_batch([ForwardItem(tree, main, "all", ((p + 2, branch_a), (p + 5, branch_b)))])[0]
    assert out.shape[0] == 6 + 3 + 2 and tree.length == p + 6
    for at, branch, rows in ((2, branch_a, out[6:9]), (5, branch_b, out[9:11])):
        alone = engine.new_sequence()
        engine.forward(alone, prompt)
        path = engine.forward(alone, main[:at] + branch)[at:]
        assert torch.equal(rows, path), f"branch at {at} differs by {(rows - path).abs().max()}"
    main_alone = engine.new_sequence()
    engine.forward(main_alone, prompt)
    assert torch.equal(out[:6], engine.forward(main_alone, main))  # the branches left the slot's own rows alone
    engine.adopt_branch(tree, p + 2, 2)  # the path: main[:2] + branch_a[:2]
    assert tree.length == p + 4
    nxt = torch.randint(3, engine.vocab_size, (3,), generator=gen).tolist()
    path = engine.new_sequence()
    engine.forward(path, prompt + main[:2] + branch_a[:2])
    assert torch.equal(engine.forward(tree, nxt), engine.forward(path, nxt))


# ---------------------------------------------------------------- verdicts


def _session(engine, prompt, max_new_tokens=64):
    return VerifierSession(engine, prompt, GREEDY, max_new_tokens=max_new_tokens, max_draft_len=16,
                           policy=SessionPolicy(max_branches=4))


def test_a_hedge_hit_commits_past_the_correction(tiny_engine, greedy_path):
    prompt, want = greedy_path
    session = _session(tiny_engine, prompt)
    p = len(prompt)
    wrong = (want[3] + 1) % tiny_engine.vocab_size
    drafts = [*want[:3], wrong, *want[4:6]]  # rejected at index 3
    hedges = ((1, [(want[1] + 5) % tiny_engine.vocab_size]), (3, [want[3], want[4], (want[5] + 1) % 512]))
    verdict, = session.verify_chain([PendingBlock(0, p, drafts, branches=hedges)])
    assert (verdict.accepted, verdict.branch, verdict.branch_accepted) == (3, 2, 1)
    assert verdict.committed(drafts, hedges) == want[:6] and verdict.is_correction
    assert session.tokens[p:] == want[:6] and session.forwards == 2  # the prefill, then one forward for the tree
    # The cache holds the branch's path: the next block verifies on it as if the branch had been the drafts.
    nxt, = session.verify_chain([PendingBlock(1, p + 6, want[6:10])])
    assert (nxt.accepted, nxt.token) == (4, want[10])


def test_branches_of_a_block_whose_first_drafts_are_skipped_are_renumbered(tiny_engine, greedy_path):
    """A block starting before the next position (its first drafts guessed tokens decoded alone): the
    branch hung on a skipped draft is dropped, the others count from the verdict's start."""
    prompt, want = greedy_path
    session = _session(tiny_engine, prompt)
    p = len(prompt)
    session.verify_chain([PendingBlock(0, p, [want[0]])])  # two tokens committed: want[0], then the bonus
    wrong = (want[3] + 1) % tiny_engine.vocab_size
    drafts = [want[1], want[2], wrong, want[4]]  # starts at p + 1: draft 0 is committed already
    hedges = ((0, [(want[1] + 3) % 512]), (2, [want[3], want[4], want[5]]))
    verdict, = session.verify_chain([PendingBlock(0, p + 1, drafts, branches=hedges)])
    assert (verdict.start_position, verdict.accepted, verdict.branch, verdict.branch_accepted) == (p + 2, 1, 1, 2)
    assert verdict.committed(drafts[1:], hedges[1:]) == want[2:7] and session.tokens[p:] == want[:7]


def test_a_hedge_miss_is_a_plain_correction(tiny_engine, greedy_path):
    prompt, want = greedy_path
    session = _session(tiny_engine, prompt)
    p = len(prompt)
    drafts = [want[0], (want[1] + 1) % 512, want[2]]
    hedges = ((1, [(want[1] + 2) % 512, want[2]]),)  # bets on the wrong correction
    verdict, = session.verify_chain([PendingBlock(0, p, drafts, branches=hedges)])
    assert (verdict.accepted, verdict.token, verdict.branch) == (1, want[1], 0)
    assert session.tokens[p:] == want[:2]
    nxt, = session.verify_chain([PendingBlock(1, p + 2, want[2:5])])
    assert (nxt.accepted, nxt.token) == (3, want[5])


def test_the_token_limit_inside_a_taken_branch(tiny_engine, greedy_path):
    prompt, want = greedy_path
    session = _session(tiny_engine, prompt, max_new_tokens=4)
    p = len(prompt)
    drafts = [want[0], (want[1] + 1) % 512]
    verdict, = session.verify_chain([PendingBlock(0, p, drafts, branches=((1, want[1:6]),))])
    assert verdict.done and verdict.stop_reason is StopReason.LENGTH
    assert (verdict.accepted, verdict.branch, verdict.branch_accepted, verdict.token) == (1, 1, 2, None)
    assert session.tokens[p:] == want[:4]


@pytest.mark.parametrize(
    "branches, message",
    [
        (((5, [1]),), "distinct drafts"),  # past the block
        (((0, [1]), (0, [2])), "distinct drafts"),
        (((0, [1]), (1, [1]), (2, [1]), (0, [1]), (1, [1])), "exceeds the limit"),
        (((0, []),), "1 to"),
        (((0, [1] * 17),), "1 to"),
    ],
)
def test_bad_branches_are_refused(tiny_engine, greedy_path, branches, message):
    prompt, want = greedy_path
    session = _session(tiny_engine, prompt)
    with pytest.raises(BlockRejected, match=message):
        session.verify_chain([PendingBlock(0, len(prompt), want[:3], branches=branches)])


# ---------------------------------------------------------------- the edge's side


def test_hedge_picks_where_the_block_most_likely_first_fails_and_restores_the_speculation():
    class Continuing:
        def __init__(self):
            self._spec = Speculation.start([1, 2])
            self._spec.tokens.extend([10, 11, 12, 13])

        def draft_branch(self, back, first, n, stop=None):
            with self._spec.branched(back, first):
                return DraftBlock([len(self._spec.tokens)] * n)  # says where the branch stood

    drafter = Continuing()
    # Drafts 1 and 3 are as uncertain as each other, but the block seldom gets past draft 1 to fail at 3.
    block = DraftBlock([10, 11, 12, 13], runner_up=[20, 21, None, 23], margins=[3.0, 0.1, 0.1, 0.1])
    hedged = hedge(drafter, block, width=2, branch_len=3)
    assert hedged.branches == ((0, [20, 3, 3]), (1, [21, 4, 4]))  # (index 2 has no runner-up)
    assert drafter._spec.tokens == [1, 2, 10, 11, 12, 13]
    assert hedge(drafter, block, width=0) is block
    assert hedge(drafter, DraftBlock([5], q=[object()], runner_up=[6]), width=2).branches == ()


@pytest.mark.parametrize("right", [True, False])
def test_scripted_hits_and_misses_end_to_end(tiny_engine, greedy_path, right):
    prompt, want = greedy_path
    drafter = ScriptedDrafter(tiny_engine.vocab_size, want, len(prompt), right)
    got = generate(tiny_engine, drafter, prompt, GREEDY, max_new_tokens=30, spec=SpecConfig(3, window=2, hedge_width=1))
    stats = got.stats
    assert got.tokens == want[:30]
    assert stats.hedges_sent > 0
    if right:  # every draft is wrong and every bet right: each round commits the branch (3 tokens) and one more
        assert stats.hedges_taken == stats.hedges_sent and stats.hedge_tokens >= 2 * stats.hedges_taken - 3
        assert got.stats.rounds <= 30 // 3
    else:
        assert stats.hedges_taken == 0 and stats.hedge_tokens == 0


@pytest.mark.parametrize("drafter_name", ["drafter_f32", "drafter_noisy"])
@pytest.mark.parametrize("mode", [Mode.GREEDY, Mode.COUPLED])
@pytest.mark.parametrize("window, width", [(1, 1), (3, 2)])
def test_hedged_decoding_is_token_identical(tiny_models, tiny_engine, drafter_name, mode, window, width):
    drafter = tiny_drafter(tiny_models, drafter_name)
    try:
        for text, seed in (("The cat sat on the mat.", 0), ("We have 3 dogs and 12 cats!", 4)):
            prompt = tiny_prompt(tiny_engine, text)
            params = SamplingParams(mode=mode, temperature=0.9, seed=seed)
            want = generate(tiny_engine, drafter, prompt, params, max_new_tokens=40, spec=SpecConfig(0))
            got = generate(tiny_engine, drafter, prompt, params, max_new_tokens=40,
                           spec=SpecConfig(5, window=window, hedge_width=width))
            assert got.tokens == want.tokens and got.stop_reason == want.stop_reason
            assert got.stats.hedges_sent > 0
    finally:
        drafter.close()


def test_hedged_decoding_over_grpc(tiny_engine, tiny_models, tiny_vocab, verifier):
    drafter = tiny_drafter(tiny_models, "drafter_noisy")
    try:
        prompt = tiny_prompt(tiny_engine, "We have 3 dogs and 12 cats!")
        params = SamplingParams(mode=Mode.COUPLED, temperature=0.9, seed=6)
        want = generate(tiny_engine, drafter, prompt, params, max_new_tokens=48, spec=SpecConfig(0))
        link = GrpcVerifier(VerifierEndpoint(verifier.address, *tiny_vocab))
        got = run_decode(drafter, link, prompt, params, max_new_tokens=48, spec=SpecConfig(5, window=2, hedge_width=2))
        assert got.tokens == want.tokens
        assert got.stats.hedges_sent > 0 and got.stats.hedges_taken > 0  # the noisy drafter's runner-up is often right
    finally:
        drafter.close()


def test_hostile_branches_end_only_their_stream(tiny_engine, tiny_vocab, verifier):
    prompt = tiny_prompt(tiny_engine, TEXT)
    encoded = codec.encode_tokens(prompt, tiny_vocab[0])
    stub = pb_grpc.VerifierStub(grpc.insecure_channel(verifier.address))

    def stream(draft: pb.Draft, mode=Mode.GREEDY):
        opening = pb.EdgeFrame(open=pb.Open(vocab_size=tiny_vocab[0], vocab_fingerprint=tiny_vocab[1], prompt=encoded.data,
                                            max_new_tokens=16, max_draft_len=8, first_token=True,
                                            sampling=sampling_to_proto(SamplingParams(mode=mode, temperature=0.8))))
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.Decode(iter([opening, pb.EdgeFrame(draft=draft)])))
        return caught.value

    one = codec.encode_tokens([5], tiny_vocab[0]).data
    start = len(prompt) + 1
    packed = codec.encode_draft([5, 6, 7], tiny_vocab[0])
    drafts = dict(start_position=start, payload=packed.data, compressed=packed.compressed)
    huge = codec.encode_tokens([5] * 40, tiny_vocab[0]).data
    cases = [
        (pb.Draft(**drafts, branches=[pb.Branch(at=3, payload=one)]), "distinct drafts"),  # out of range
        (pb.Draft(**drafts, branches=[pb.Branch(at=0, payload=one), pb.Branch(at=0, payload=one)]), "distinct drafts"),
        (pb.Draft(**drafts, branches=[pb.Branch(at=i % 3, payload=one) for i in range(5)]), "limit is 4"),  # too many
        (pb.Draft(**drafts, branches=[pb.Branch(at=0, payload=huge)]), "limit is 8"),  # too long
        (pb.Draft(**drafts, branches=[pb.Branch(at=0, payload=b"\xff" * 3)]), "trailing bits"),  # malformed payload
    ]
    for draft, message in cases:
        error = stream(draft)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and message in error.details(), error.details()
    # The same block with a sound branch is verified.
    opening = pb.EdgeFrame(open=pb.Open(vocab_size=tiny_vocab[0], vocab_fingerprint=tiny_vocab[1], prompt=encoded.data,
                                        max_new_tokens=16, max_draft_len=8, first_token=True,
                                        sampling=sampling_to_proto(GREEDY)))
    replies = list(stub.Decode(iter([opening, pb.EdgeFrame(draft=pb.Draft(**drafts, branches=[pb.Branch(at=1, payload=one)])),
                                     pb.EdgeFrame(close=pb.Close())]), timeout=30))
    assert [r.WhichOneof("kind") for r in replies] == ["opened", "verdict"]
    q = codec.encode_draft([5], tiny_vocab[0], [SparseDist(np.array([5]), np.array([256]), 8)], draft_top_k=16)
    error = stream(pb.Draft(start_position=start, payload=q.data, compressed=q.compressed,
                            branches=[pb.Branch(at=0, payload=one)]), mode=Mode.REJECTION)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "rejection" in error.details()
    # An honest stream still decodes.
    link = GrpcVerifier(VerifierEndpoint(verifier.address, *tiny_vocab))
    drafter = ScriptedDrafter(tiny_vocab[0], [0] * 64, len(prompt), right=False)
    got = run_decode(drafter, link, prompt, GREEDY, max_new_tokens=8, spec=SpecConfig(0))
    assert len(got.tokens) == 8
