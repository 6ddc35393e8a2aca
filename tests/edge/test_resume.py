"""Surviving the link: a broken stream is resumed (or the session reopened) and the output is
that of an unbroken run; in process with verdicts lost on purpose, and over real gRPC through
the link emulator cutting at exact byte offsets, with verifier restarts."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import grpc
import pytest
from helpers import accepted_unchecked, exact_distribution, rejection_sampling, target_fit, tiny_drafter, tiny_prompt

from cloud.limits import ServiceLimits
from cloud.server import BackgroundServer, ServerConfig
from edge.decode_loop import LinkLost, run_decode
from edge.endpoint import VerifierEndpoint
from edge.grpc_verifier import GrpcVerifier
from edge.schedule import SpecConfig
from edge.verifier_protocol import Received, VerifierError
from protos import splitspec_pb2 as pb
from protos import splitspec_pb2_grpc as pb_grpc
from shared import codec
from shared.params import Mode, SamplingParams
from shared.verdict import StopReason
from shared.wire import sampling_to_proto
from sim.experiment.processes import BackgroundLink
from sim.inprocess import LocalVerifier, generate
from sim.link.config import DirectionConfig, LinkConfig

TEXT = "The cat sat on the mat."
MODES = [SamplingParams(mode=Mode.GREEDY), SamplingParams(mode=Mode.COUPLED, temperature=0.9, seed=3)]


@pytest.fixture(scope="module")
def drafter(tiny_models):
    made = tiny_drafter(tiny_models, "drafter_noisy")
    yield made
    made.close()


# ---------------------------------------------------------------- in process: the loop's side


class LossyVerifier(LocalVerifier):
    """Breaks the link on chosen ``receive`` calls: sometimes after the cloud verified what was
    pending (its verdicts are lost), sometimes before (the blocks are lost)."""

    def __init__(self, engine, breaks: dict[int, bool]) -> None:
        super().__init__(engine)
        self.breaks = breaks  # receive call number -> verify first
        self.calls = 0
        self.resumes = 0

    def receive(self):
        self.calls += 1
        verify_first = self.breaks.get(self.calls)
        if verify_first is None:
            return super().receive()
        if verify_first:
            while self._pending and not self.session.done:
                self._verdicts.extend(map(Received, self.session.verify_chain(self._pending)))
        raise LinkLost(f"cut on receive {self.calls}")

    def resume(self, committed):
        self.resumes += 1
        return super().resume(committed)


@pytest.mark.parametrize("params", MODES, ids=lambda p: p.mode.value)
@pytest.mark.parametrize("window", [1, 3])
def test_lost_verdicts_and_blocks_leave_the_output_unchanged(tiny_engine, drafter, params, window):
    prompt = tiny_prompt(tiny_engine, TEXT)
    want = generate(tiny_engine, drafter, prompt, params, max_new_tokens=40, spec=SpecConfig(0))
    rng = random.Random(window)
    for trial in range(6):
        breaks = {call: rng.random() < 0.6 for call in rng.sample(range(1, 14), 4)}
        verifier = LossyVerifier(tiny_engine, breaks)
        got = run_decode(drafter, verifier, prompt, params, max_new_tokens=40, spec=SpecConfig(4, window=window))
        assert got.tokens == want.tokens, (trial, breaks)
        assert got.stop_reason == want.stop_reason and got.stats.generated == len(want.tokens)
        assert verifier.resumes == sum(call <= verifier.calls for call in breaks)


def test_a_lost_final_verdict_ends_the_generation_on_resume(tiny_engine, drafter):
    prompt = tiny_prompt(tiny_engine, TEXT)
    want = generate(tiny_engine, drafter, prompt, MODES[0], max_new_tokens=12, spec=SpecConfig(0))
    for call in range(1, 6):
        verifier = LossyVerifier(tiny_engine, {call: True})
        got = run_decode(drafter, verifier, prompt, MODES[0], max_new_tokens=12, spec=SpecConfig(8))
        assert (got.tokens, got.stop_reason) == (want.tokens, StopReason.LENGTH)


def test_rejection_mode_completes_across_lost_links(tiny_engine, drafter):
    prompt = tiny_prompt(tiny_engine, TEXT)
    params = SamplingParams(mode=Mode.REJECTION, temperature=1.0, seed=1)
    verifier = LossyVerifier(tiny_engine, {2: True, 4: False, 7: True})
    got = run_decode(drafter, verifier, prompt, params, max_new_tokens=30, spec=SpecConfig(4, window=2))
    assert len(got.tokens) == 30 and verifier.resumes == 3


@pytest.mark.slow
def test_rejection_mode_across_lost_links_still_samples_the_target(tiny_engine, drafter):
    prompt = tiny_prompt(tiny_engine, "It was the best of times")
    exact = exact_distribution(tiny_engine, prompt, rejection_sampling())
    samples, n = [], 1500
    rng = random.Random(0)
    for seed in range(n):
        verifier = LossyVerifier(tiny_engine, {rng.randrange(1, 4): rng.random() < 0.5})
        got = run_decode(drafter, verifier, prompt, rejection_sampling(seed), max_new_tokens=3,
                         spec=SpecConfig(1, window=2))
        samples.append(tuple(got.tokens))
    fit = target_fit(Counter(samples), exact)
    assert fit.fits(), fit
    # The control: the same samples, one session in ten with its drafts accepted unchecked.
    unchecked = target_fit(accepted_unchecked(samples, drafter, prompt, rejection_sampling), exact)
    assert not unchecked.fits(), unchecked


# ---------------------------------------------------------------- over gRPC, through the emulator


@pytest.fixture()
def server(serve):
    return serve(ServiceLimits(max_draft_len=16))


@pytest.fixture()
def link(server):
    with BackgroundLink(LinkConfig(), server.port) as made:
        yield made


def decode_over(link, drafter, tiny_vocab, prompt, params, **kwargs):
    verifier = GrpcVerifier(
        VerifierEndpoint(link.address, *tiny_vocab), outage_budget_s=kwargs.pop("budget", 10.0)
    )
    return run_decode(drafter, verifier, prompt, params, max_new_tokens=40, **kwargs), verifier


@pytest.mark.parametrize("params", MODES, ids=lambda p: p.mode.value)
def test_cuts_at_random_bytes_leave_the_output_unchanged(tiny_engine, tiny_vocab, drafter, server, link, params):
    prompt = tiny_prompt(tiny_engine, TEXT)
    want, clean = decode_over(link, drafter, tiny_vocab, prompt, params, spec=SpecConfig(4, window=3))
    driven = {clean.session_id}  # the sessions the edge knew (it drove each to its end, or across cuts)
    total = link.emulator.bytes_up + link.emulator.bytes_down
    rng = random.Random(7)
    recovered = 0
    for trial in range(4):
        base = link.emulator.bytes_up + link.emulator.bytes_down
        cuts_before = link.emulator.cuts
        offsets = sorted(base + rng.randrange(1, total) for _ in range(2))
        link.arm_cuts(offsets)
        got, verifier = decode_over(link, drafter, tiny_vocab, prompt, params, spec=SpecConfig(4, window=3))
        driven.add(verifier.session_id)
        link.arm_cuts([])
        cut = link.emulator.cuts - cuts_before
        assert got.tokens == want.tokens, (trial, offsets)
        # Every recovery answers a cut; a cut after the final verdict (on the Close) needs none.
        assert cut >= 1 and len(verifier.recoveries) <= cut
        recovered += len(verifier.recoveries)
        assert got.stats.generated == len(want.tokens)
        assert not any(r.reopened for r in verifier.recoveries)  # a cut never costs the cloud its session
    assert not clean.recoveries and recovered >= 2  # the cuts did break generations
    # Every session the edge drove ended (resumed ones included): none is still attached to a stream
    # or parked unfinished. Two kinds stay parked until the TTL, by design: a finished one whose final
    # verdict or Close a cut ate (``GrpcVerifier.close``), and one whose Opened a cut ate (the edge never
    # learned it and opened anew).
    table = server.server.servicer.table

    def left_over() -> list[str]:
        return [e.session_id for e in list(table._by_ticket.values())
                if e.session_id in driven and (e.attached or not e.session.done)]

    deadline = time.monotonic() + 5
    while left_over() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left_over(), "sessions the edge drove still held 5 s after the last generation"


@pytest.mark.parametrize("params", MODES, ids=lambda p: p.mode.value)
def test_jitter_and_burst_stalls_leave_the_output_the_targets(tiny_engine, tiny_vocab, drafter, server, params):
    """Over a link with jitter both ways and seeded burst stalls (what ``lte-mobile`` has, shorter and more
    often), a pipelined, hedge-free split decode is token-identical to target-only decoding. The stalls
    come every 0.1 s on average: at 0.3 s a Zen 5 EPYC finished the run before the second began, and the
    check that the run outlasted a stall failed (the bursts' times are seeded, the run's length is not)."""
    prompt = tiny_prompt(tiny_engine, TEXT)
    want = generate(tiny_engine, drafter, prompt, params, max_new_tokens=40, spec=SpecConfig(0))
    way = DirectionConfig(delay_s=0.01, jitter_s=0.008, jitter_dist="normal", stall_every_s=0.1, stall_s=0.03)
    with BackgroundLink(LinkConfig(up=way, down=way, seed=11), server.port) as link:
        got, _ = decode_over(link, drafter, tiny_vocab, prompt, params, spec=SpecConfig(4, window=3))
        assert all(len(stalls.bursts) >= 2 for stalls in link.emulator.stalls.values())  # the run outlasted a stall
    assert got.tokens == want.tokens


def test_a_restarted_verifier_gets_the_session_reopened_with_identical_output(tiny_engine, tiny_vocab, drafter):
    prompt = tiny_prompt(tiny_engine, TEXT)
    params = MODES[1]
    want = generate(tiny_engine, drafter, prompt, params, max_new_tokens=40, spec=SpecConfig(0))
    limits = ServiceLimits(max_draft_len=16)
    first = BackgroundServer(tiny_engine, ServerConfig(port=0, limits=limits)).start()
    port = first.port
    verifier = GrpcVerifier(VerifierEndpoint(f"127.0.0.1:{port}", *tiny_vocab), outage_budget_s=20)
    replaced = []

    def restart_after(tokens):
        if not replaced and sum(map(len, seen)) >= 10:
            first.stop(grace=0)  # every session is lost with it
            replaced.append(BackgroundServer(tiny_engine, ServerConfig(port=port, limits=limits)).start())

    seen: list[list[int]] = []

    def on_tokens(tokens) -> None:
        seen.append(tokens)
        restart_after(tokens)

    got = run_decode(drafter, verifier, prompt, params, max_new_tokens=40, spec=SpecConfig(4, window=2),
                     on_tokens=on_tokens)
    try:
        assert got.tokens == want.tokens
        assert [r.reopened for r in verifier.recoveries] == [True]
        assert verifier.recoveries[0].recover_s >= verifier.recoveries[0].reconnect_s > 0
    finally:
        replaced[0].stop()


def test_an_outage_past_the_budget_ends_with_the_tokens_so_far(tiny_engine, tiny_vocab, drafter):
    prompt = tiny_prompt(tiny_engine, TEXT)
    running = BackgroundServer(tiny_engine, ServerConfig(port=0, limits=ServiceLimits(max_draft_len=16))).start()
    verifier = GrpcVerifier(VerifierEndpoint(running.address, *tiny_vocab, connect_timeout_s=0.5), outage_budget_s=1.0)
    seen: list[int] = []

    def stop_midway(tokens):
        seen.extend(tokens)
        if len(seen) >= 8 and running.server.port:
            running.stop(grace=0)
            running.server.port = 0

    started = time.monotonic()
    with pytest.raises(VerifierError, match="could not resume within the outage budget of 1s") as caught:
        run_decode(drafter, verifier, prompt, MODES[0], max_new_tokens=40, spec=SpecConfig(2), on_tokens=stop_midway)
    assert time.monotonic() - started < 10
    assert caught.value.partial is not None and caught.value.partial.tokens == seen and len(seen) >= 8


def test_a_resume_takes_over_a_stream_the_server_still_holds(tiny_engine, tiny_vocab, server):
    """The edge reconnects before the server noticed the old stream died: the ticket wins."""
    stub = pb_grpc.VerifierStub(grpc.insecure_channel(server.address))
    prompt = tiny_prompt(tiny_engine, TEXT)
    encoded = codec.encode_tokens(prompt, tiny_vocab[0])
    old_frames: list = [
        pb.EdgeFrame(open=pb.Open(vocab_size=tiny_vocab[0], vocab_fingerprint=tiny_vocab[1], prompt=encoded.data,
                                  prompt_compressed=encoded.compressed, max_new_tokens=20, max_draft_len=4,
                                  sampling=sampling_to_proto(MODES[0]), first_token=True))
    ]
    gate = threading.Event()

    def old_requests():
        yield old_frames[0]
        gate.wait(10)  # the old stream stays open and silent, then drafts once more
        empty = codec.encode_draft([], tiny_vocab[0])
        yield pb.EdgeFrame(draft=pb.Draft(epoch=0, start_position=len(prompt) + 1, payload=empty.data))

    old = stub.Decode(old_requests())
    opened = next(old).opened
    first = opened.first_verdict  # the first position, answered with the Open
    new = stub.Decode(iter([pb.EdgeFrame(open=pb.Open(resume_ticket=opened.resume_ticket,
                                                      committed_length=len(prompt)))]))
    resumed = next(new).opened
    assert resumed.resume_ticket == opened.resume_ticket
    assert resumed.committed_length == len(prompt) + 1 and resumed.epoch == 0  # a bonus keeps the epoch
    assert codec.decode_tokens(resumed.committed_tail, resumed.committed_tail_compressed, tiny_vocab[0], max_tokens=8).tolist() == [
        first.token
    ]
    gate.set()
    with pytest.raises(grpc.RpcError) as caught:  # the old stream may no longer drive the session
        list(old)
    assert caught.value.code() == grpc.StatusCode.ABORTED, caught.value.details()
    for bad in (len(prompt) + 2,):  # claiming more than the session committed is refused
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.Decode(iter([pb.EdgeFrame(open=pb.Open(resume_ticket=opened.resume_ticket,
                                                                committed_length=bad))])))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()


def test_a_final_verdict_lost_in_a_cut_is_recovered_by_resuming(tiny_engine, tiny_vocab, server):
    """Until the edge acknowledges the final verdict (Close), the finished session stays resumable."""
    stub = pb_grpc.VerifierStub(grpc.insecure_channel(server.address))
    prompt = tiny_prompt(tiny_engine, TEXT)
    encoded = codec.encode_tokens(prompt, tiny_vocab[0])
    gate = threading.Event()

    def requests():
        yield pb.EdgeFrame(open=pb.Open(vocab_size=tiny_vocab[0], vocab_fingerprint=tiny_vocab[1], prompt=encoded.data,
                                        prompt_compressed=encoded.compressed, max_new_tokens=1, max_draft_len=4,
                                        sampling=sampling_to_proto(MODES[0]), first_token=True))
        gate.wait(10)

    call = stub.Decode(requests())
    opened = next(call).opened
    final = opened.first_verdict
    assert final.done and final.stop_reason == pb.STOP_REASON_LENGTH
    call.cancel()  # the link breaks before the edge could say it has the final verdict
    gate.set()
    resume = pb.EdgeFrame(open=pb.Open(resume_ticket=opened.resume_ticket, committed_length=len(prompt),
                                       first_token=True))
    deadline = time.monotonic() + 5
    while True:  # the server may not have seen the cancellation yet
        try:
            answers = list(stub.Decode(iter([resume])))
            break
        except grpc.RpcError:
            assert time.monotonic() < deadline, "the finished session was not kept for a resume"
            time.sleep(0.05)
    (only,) = answers  # the Opened, no verdict: the session is over
    resumed = only.opened
    assert resumed.stop_reason == pb.STOP_REASON_LENGTH and not resumed.HasField("first_verdict")
    assert codec.decode_tokens(resumed.committed_tail, resumed.committed_tail_compressed, tiny_vocab[0],
                               max_tokens=4).tolist() == [final.token]
    assert not server.server.servicer.table.parked  # answered once, then gone


def test_a_block_left_over_after_the_final_verdict_does_not_end_the_session(tiny_engine, tiny_vocab, server, drafter):
    """Blocks in flight when the generation ends are skipped; only a Close ends the session."""
    stub = pb_grpc.VerifierStub(grpc.insecure_channel(server.address))
    prompt = tiny_prompt(tiny_engine, TEXT)
    V, P = tiny_vocab[0], len(prompt)
    encoded = codec.encode_tokens(prompt, V)
    want = generate(tiny_engine, drafter, prompt, MODES[0], max_new_tokens=4, spec=SpecConfig(0)).tokens

    def draft(start, tokens, more):
        block = codec.encode_draft(tokens, V)
        return pb.EdgeFrame(draft=pb.Draft(epoch=0, start_position=start, payload=block.data,
                                           compressed=block.compressed, more_follows=more))

    frames = [
        pb.EdgeFrame(open=pb.Open(vocab_size=V, vocab_fingerprint=tiny_vocab[1], prompt=encoded.data,
                                  prompt_compressed=encoded.compressed, max_new_tokens=2, max_draft_len=4,
                                  sampling=sampling_to_proto(MODES[0]))),
        draft(P, want[:1], True),  # accepted, its bonus deferred
        draft(P + 1, want[1:2], False),  # accepted: two tokens, the limit
    ]
    finished = threading.Event()

    def requests():
        yield from frames
        finished.wait(10)
        yield draft(P + 2, want[2:3], False)  # drafted before the final verdict reached the edge
        time.sleep(0.2)
        # then a half-close without Close: the edge keeps the session

    answers = []
    for answer in stub.Decode(requests()):
        answers.append(answer)
        if answer.WhichOneof("kind") == "verdict" and answer.verdict.done:
            finished.set()
    assert answers[-1].verdict.done
    resume = pb.EdgeFrame(open=pb.Open(resume_ticket=answers[0].opened.resume_ticket, committed_length=P))
    (resumed,) = list(stub.Decode(iter([resume])))
    assert resumed.opened.stop_reason == pb.STOP_REASON_LENGTH and resumed.opened.committed_length == P + 2
