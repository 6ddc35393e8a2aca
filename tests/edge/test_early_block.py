"""The first token and the early block: the first verdict rides in the Opened, and the edge's first
block (drafted on its own guess for the first token while the prefill runs) leaves before it."""

from __future__ import annotations

import queue
import time

import grpc
import pytest
from helpers import GREEDY, TEXTS, CountingController, ScriptedDrafter, tiny_drafter, tiny_prompt

from edge.decode_loop import run_decode
from edge.endpoint import VerifierEndpoint
from edge.grpc_verifier import GrpcVerifier
from edge.schedule import SpecConfig
from protos import splitspec_pb2 as pb
from protos import splitspec_pb2_grpc as pb_grpc
from shared import codec
from shared.params import Mode, SamplingParams
from shared.wire import sampling_to_proto
from sim.inprocess import generate


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


@pytest.mark.parametrize("cloud_limit", [16, 3])
def test_the_first_block_leaves_before_the_opened(tiny_engine, tiny_models, tiny_vocab, cloud_limit):
    """The edge drafts its first block while the prefill runs (on its own guess for the first
    token) and sends it before the Opened comes; a verifier whose draft limit it exceeds drops it
    unanswered, and the edge drafts again. Output is target-only's either way."""
    from cloud.limits import ServiceLimits
    from cloud.server import BackgroundServer, ServerConfig
    from edge.early_block import EARLY_DRAFT_LEN

    drafter = tiny_drafter(tiny_models, "drafter_noisy")
    sent: list = []

    class Watching(GrpcVerifier):
        def _send(self, epoch, start_position, block, more_follows, *, before_opened=False, empty_blocks=1):
            sent.extend((before_opened, start_position + i, len(block.tokens)) for i in range(empty_blocks))
            return super()._send(epoch, start_position, block, more_follows, before_opened=before_opened,
                                 empty_blocks=empty_blocks)

        def _send_behind_open(self, start_position):  # over loopback the Opened could beat the drafting
            head_start = super()._send_behind_open(start_position)
            deadline = time.monotonic() + 10
            while self._behind_open.early_sent is None and time.monotonic() < deadline:
                time.sleep(0.001)
            return head_start

    chained = 0
    try:
        with BackgroundServer(tiny_engine, ServerConfig(port=0, limits=ServiceLimits(max_draft_len=cloud_limit))) as server:
            for seed in range(4):  # the noisy drafter's guess for the first token is sometimes wrong
                prompt = tiny_prompt(tiny_engine, TEXTS[seed % len(TEXTS)])
                params = SamplingParams(mode=Mode.COUPLED, temperature=0.9, seed=seed)
                want = generate(tiny_engine, drafter, prompt, params, max_new_tokens=30, spec=SpecConfig(0))
                sent.clear()
                link = Watching(VerifierEndpoint(server.address, *tiny_vocab))
                got = run_decode(drafter, link, prompt, params, max_new_tokens=30, spec=SpecConfig(5, window=2))
                assert got.tokens == want.tokens
                assert sent[0] == (True, len(prompt) + 1, EARLY_DRAFT_LEN) and not any(e for e, _, _ in sent[1:])
                if cloud_limit < EARLY_DRAFT_LEN:  # dropped: drafted again after the first token, within the limit
                    assert sent[1] == (False, len(prompt) + 1, cloud_limit)
                else:  # kept: the next block continues it at once (when the guess was right)
                    chained += sent[1][1] == len(prompt) + 1 + EARLY_DRAFT_LEN
        assert chained or cloud_limit < EARLY_DRAFT_LEN
    finally:
        drafter.close()


def test_wrong_first_token_guess_holds_the_chain(tiny_engine, greedy_path):
    """A wrong guess for the first token holds the chain until the early block is answered.

    ScriptedDrafter's guesses are all wrong: the early block rests on a token the target did not
    pick, so nothing may be chained on it (its positions would be off); it is answered, then
    drafting resumes from the committed tokens."""
    prompt, want = greedy_path
    drafter = ScriptedDrafter(tiny_engine.vocab_size, want, len(prompt), right=False)
    got = generate(tiny_engine, drafter, prompt, GREEDY, max_new_tokens=16, spec=SpecConfig(3, window=3))
    assert got.tokens == want[:16]
    # Its verdict measures nothing about the drafter (it was drafted after a token the target did not
    # pick): the controller's acceptance hears only of the blocks drafted after it.
    controller = CountingController(max_draft_len=3, window=3, cloud_window=16)
    drafter = ScriptedDrafter(tiny_engine.vocab_size, want, len(prompt), right=False)
    got = generate(tiny_engine, drafter, prompt, GREEDY, max_new_tokens=16,
                   spec=SpecConfig(3, window=3, controller=controller))
    assert got.tokens == want[:16] and controller.blocks > 0
    assert controller.acceptances == controller.blocks  # the early block (answered: a round) fed nothing
    assert got.stats.rounds > controller.blocks


def test_early_block_dropped_past_limit_refused_past_cap(tiny_engine, tiny_vocab, verifier):
    """An early block is dropped past the session limit and refused past the protocol cap."""
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
    inner = tiny_drafter(tiny_models, "drafter_f32")
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
        got = generate(tiny_engine, Logged(), prompt, GREEDY, max_new_tokens=24,
                       spec=SpecConfig(4, window=4, controller=controller),
                       on_tokens=lambda tokens: events.append("tokens"))
        assert len(got.tokens) == 24
        assert events.index("tokens") < events.index("draft")
        # Every drafted block fed acceptance (observe_block goes through observe_acceptance); the
        # early block fed nothing else.
        assert controller.acceptances == controller.blocks + 1 and controller.blocks > 0
    finally:
        inner.close()
