"""Untrusted input on the verifier's wire: a bad frame ends only its own session.

Hand-crafted ``EdgeFrame``s go through a raw stub to a real server on loopback.
Each hostile stream must end with the right status and a message that says
what was wrong, and nothing else: no verdict, no hang, no leaked session, no
unbounded memory. All the while an honest edge (``GrpcVerifier`` + ``run_decode``
with the tiny F32 drafter) decodes against the same server, session after
session, and must keep producing exactly the target-only tokens.
"""

from __future__ import annotations

import copy
import gc
import queue
import random
import threading
import time
from typing import NamedTuple

import grpc
import numpy as np
import pytest
import zstandard
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import tiny_drafter

from cloud.limits import ServiceLimits
from cloud.server import SERVICE_NAME, BackgroundServer, ServerConfig
from edge.decode_loop import run_decode
from edge.endpoint import VerifierEndpoint
from edge.grpc_verifier import GrpcVerifier
from edge.schedule import SpecConfig
from protos import splitspec_pb2 as pb
from protos import splitspec_pb2_grpc as pb_grpc
from shared import codec
from shared.params import Mode, SamplingParams
from shared.sparse import SparseDist
from shared.wire import sampling_to_proto
from sim.bench.hostile_frames import HostileFrames
from sim.inprocess import generate

BOS = 1
PROMPT_TEXT = "The cat sat on the mat."
NEW_TOKENS = 40
GREEDY = SamplingParams(mode=Mode.GREEDY)
MAX_DRAFT_LEN = 16  # the server's block limit, as in the shared `verifier` fixture
TTL_S = 30.0  # as in the shared fixture: a leaked session would outlive this module
CALL_TIMEOUT_S = 15.0  # every hostile call has a deadline: a hang fails the test, never blocks it
SERVING = health_pb2.HealthCheckResponse.SERVING
INVALID = grpc.StatusCode.INVALID_ARGUMENT
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
ALLOWED_ENDINGS = {grpc.StatusCode.OK, INVALID, PRECONDITION, grpc.StatusCode.NOT_FOUND}


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def server(serve_module):
    """One verifier for the whole module, so the honest sessions span every hostile case.

    The shared ``verifier`` fixture's limits (D <= 16, TTL 30 s), module-scoped; no bound on the Open
    rate (the fuzzer opens ~140 sessions in seconds from one address; the bound: test_open_rate.py).
    """
    limits = ServiceLimits(max_draft_len=MAX_DRAFT_LEN, session_ttl_s=TTL_S, rejection_to=("all",),
                           opens_per_client_s=0)
    return serve_module(limits)


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(server.address) as ch:
        yield ch


@pytest.fixture(scope="module")
def stub(channel):
    return pb_grpc.VerifierStub(channel)


@pytest.fixture(scope="module")
def prompt(tiny_engine):
    return [BOS, *tiny_engine.tokenizer(PROMPT_TEXT, add_special_tokens=False).input_ids]


@pytest.fixture(scope="module")
def want(tiny_engine, tiny_models, prompt):
    """Target-only greedy tokens, computed in-process before any traffic."""
    drafter = tiny_drafter(tiny_models, "drafter_f32")
    try:
        result = generate(tiny_engine, drafter, prompt, GREEDY, max_new_tokens=NEW_TOKENS, spec=SpecConfig(0))
    finally:
        drafter.close()
    assert len(result.tokens) == NEW_TOKENS
    return result.tokens


class HonestTraffic:
    """Honest edge sessions, back to back on a thread, until stopped (at least two: how many run beside
    the hostile streams depends on the machine's load, not on the server)."""

    def __init__(self, address: str, drafter, vocab, prompt, want) -> None:
        self.address, self.drafter, self.vocab = address, drafter, vocab
        self.prompt, self.want = prompt, want
        self.completed = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="honest-edge", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while self.completed < 2 or not self._stop.is_set():
            link = GrpcVerifier(VerifierEndpoint(self.address, *self.vocab, connect_timeout_s=10), verdict_timeout_s=30)
            try:
                result = run_decode(self.drafter, link, self.prompt, GREEDY,
                                    max_new_tokens=NEW_TOKENS, spec=SpecConfig(4))
            except Exception as exc:  # noqa: BLE001 - any failure is the finding
                self.errors.append(f"honest session {self.completed + 1} failed: {exc!r}")
                return
            if result.tokens != self.want:
                self.errors.append(f"honest session {self.completed + 1} diverged: {result.tokens}")
                return
            self.completed += 1
            self._stop.wait(0.05)  # leave some CPU to the hostile streams

    def check(self) -> None:
        assert not self.errors, self.errors

    def stop(self, timeout_s: float = 60.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the honest session hung"
        self.check()


@pytest.fixture(scope="module")
def honest(server, tiny_models, tiny_vocab, prompt, want):
    drafter = tiny_drafter(tiny_models, "drafter_f32")
    traffic = HonestTraffic(server.address, drafter, tiny_vocab, prompt, want)
    yield traffic
    traffic.stop()
    drafter.close()


@pytest.fixture(autouse=True)
def honest_unharmed(honest):
    """Every test runs while honest sessions decode; none of them may notice."""
    yield
    honest.check()


# ---------------------------------------------------------------- frames and calls


def open_frame(vocab, prompt_tokens, params=GREEDY, **fields) -> pb.EdgeFrame:
    """A valid Open for ``prompt_tokens``; ``fields`` override any Open field (``prompt`` too)."""
    encoded = codec.encode_tokens(prompt_tokens, vocab[0])
    message = dict(
        vocab_size=vocab[0], vocab_fingerprint=vocab[1], sampling=sampling_to_proto(params),
        prompt=encoded.data, prompt_compressed=encoded.compressed, max_new_tokens=NEW_TOKENS,
    )
    message.update(fields)
    return pb.EdgeFrame(open=pb.Open(**message))


def raw_draft(epoch: int, start: int, payload: bytes, compressed: bool = False) -> pb.EdgeFrame:
    return pb.EdgeFrame(draft=pb.Draft(epoch=epoch, start_position=start, payload=payload, compressed=compressed))


def token_draft(epoch: int, start: int, tokens, vocab_size: int) -> pb.EdgeFrame:
    encoded = codec.encode_tokens(tokens, vocab_size)
    return raw_draft(epoch, start, encoded.data, encoded.compressed)


CLOSE = pb.EdgeFrame(close=pb.Close())


def call(stub, frames, timeout: float = CALL_TIMEOUT_S) -> tuple[list[pb.CloudFrame], grpc.StatusCode, str]:
    """Send ``frames``, then half-close: (every frame received, final code, details)."""
    responses = []
    try:
        for response in stub.Decode(iter(frames), timeout=timeout):
            responses.append(response)
    except grpc.RpcError as error:
        return responses, error.code(), error.details() or ""
    return responses, grpc.StatusCode.OK, ""


def kinds(responses) -> list[str]:
    return [r.WhichOneof("kind") for r in responses]


class Conversation:
    """A Decode stream driven frame by frame, for cases that depend on the server's answers."""

    def __init__(self, stub, timeout: float = CALL_TIMEOUT_S) -> None:
        self._frames: queue.Queue = queue.Queue()
        self._stream = stub.Decode(iter(self._frames.get, None), timeout=timeout)

    def send(self, frame: pb.EdgeFrame) -> None:
        self._frames.put(frame)

    def receive(self) -> pb.CloudFrame:
        return next(self._stream)

    def finish(self) -> tuple[grpc.StatusCode, list[pb.CloudFrame]]:
        """Half-close; (final code, frames received after the last ``receive``)."""
        self._frames.put(None)
        rest = []
        try:
            for frame in self._stream:
                rest.append(frame)
        except grpc.RpcError as error:
            return error.code(), rest
        return grpc.StatusCode.OK, rest


def health_status(channel, service: str = "") -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def wait_for_empty_table(server, timeout_s: float) -> int:
    """Sessions left in the server's table once it emptied or ``timeout_s`` passed."""
    table = server.server.servicer.table
    deadline = time.monotonic() + timeout_s
    while len(table) and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(table)


# ---------------------------------------------------------------- one bad frame per stream


class Ctx(NamedTuple):
    """What the case tables build frames from."""

    vocab: tuple[int, bytes]
    prompt: list[int]

    @property
    def V(self) -> int:
        return self.vocab[0]

    @property
    def P(self) -> int:
        return len(self.prompt)


_RANDOM = np.random.default_rng(0).bytes(64)
_WRONG_FP = bytes(range(16))


def _truncated_zstd(vocab_size: int) -> bytes:
    raw = codec.encode_tokens([5] * MAX_DRAFT_LEN, vocab_size).data
    return codec._compressor().compress(raw)[:-3]  # a valid frame, cut short


# A bad frame after a good Open: name -> (frames, given a Ctx; code; phrase in the message).
BAD_DRAFTS = {
    "random-bytes-as-zstd": (lambda c: [raw_draft(0, c.P, _RANDOM, compressed=True)],
                             INVALID, "bad draft block: bad zstd frame"),
    "random-bytes-raw": (lambda c: [raw_draft(0, c.P, _RANDOM)],  # 64 bytes: 56 ids at 9 bits
                         INVALID, f"limit is {MAX_DRAFT_LEN}"),
    "truncated-zstd": (lambda c: [raw_draft(0, c.P, _truncated_zstd(c.V), compressed=True)],
                       INVALID, "truncated payload"),
    "trailing-garbage": (lambda c: [raw_draft(0, c.P, codec.encode_tokens([3, 4], c.V).data + b"\xff")],
                         INVALID, "trailing bits are not zero"),
    "payload-over-limit": (lambda c: [raw_draft(0, c.P, bytes(codec.MAX_PAYLOAD_BYTES + 1))],
                           INVALID, f"limit is {codec.MAX_PAYLOAD_BYTES}"),
    "block-too-long": (lambda c: [token_draft(0, c.P, [7] * (MAX_DRAFT_LEN + 1), c.V)],
                       INVALID, f"has {MAX_DRAFT_LEN + 1} tokens, limit is {MAX_DRAFT_LEN}"),
    "start-position-before-the-prompt-ends": (lambda c: [token_draft(0, c.P - 1, [7, 8], c.V)],
                                              INVALID, "block starts at position"),
    "start-position-2**64-1": (lambda c: [token_draft(0, 2**64 - 1, [7], c.V)],
                               INVALID, f"starts at position {2**64 - 1}"),
    "future-epoch": (lambda c: [token_draft(3, c.P, [7, 8], c.V)],
                     INVALID, "epoch 3 is ahead of the session's epoch 0"),
    "second-open": (lambda c: [open_frame(c.vocab, c.prompt)], INVALID, "unexpected open frame"),
    "empty-frame": (lambda c: [pb.EdgeFrame()], INVALID, "unexpected"),
    "more-empty-blocks-than-may-be-in-flight": (
        lambda c: [pb.EdgeFrame(draft=pb.Draft(start_position=c.P, empty_blocks=ServiceLimits.max_empty_blocks + 1))],
        INVALID, f"{ServiceLimits.max_empty_blocks + 1} empty blocks, the limit is {ServiceLimits.max_empty_blocks}"),
    "empty-blocks-on-a-drafted-block": (
        lambda c: [pb.EdgeFrame(draft=pb.Draft(start_position=c.P, payload=b"\x01", empty_blocks=2))],
        INVALID, "empty_blocks on a block that is not empty"),
}


@pytest.mark.parametrize("name", list(BAD_DRAFTS))
def test_bad_frame_in_an_open_session_ends_it(stub, tiny_vocab, prompt, name):
    build, code, phrase = BAD_DRAFTS[name]
    ctx = Ctx(tiny_vocab, prompt)
    # A correct block after the bad one must never be answered: the stream ended there.
    good = token_draft(0, ctx.P, [], ctx.V)
    responses, got, details = call(stub, [open_frame(tiny_vocab, prompt), *build(ctx), good, CLOSE])
    assert got == code, (got, details)
    assert phrase in details, details
    assert kinds(responses) == ["opened"]


def _sampling(**fields) -> pb.Sampling:
    return pb.Sampling(**{"mode": pb.MODE_COUPLED, "temperature": 1.0, **fields})


# A bad first frame: name -> (frame, given a Ctx; code; phrase). Nothing may be opened.
BAD_OPENS = {
    "draft-before-open": (lambda c: token_draft(0, c.P, [7], c.V),
                          INVALID, "the first frame must be Open, got draft"),
    "close-before-open": (lambda c: CLOSE, INVALID, "the first frame must be Open, got close"),
    "wrong-vocab-size": (lambda c: open_frame(c.vocab, c.prompt, vocab_size=c.V - 1),
                         PRECONDITION, "vocabulary mismatch"),
    "wrong-fingerprint": (lambda c: open_frame(c.vocab, c.prompt, vocab_fingerprint=_WRONG_FP),
                          PRECONDITION, f"fingerprint {_WRONG_FP.hex()[:12]}"),
    "no-fingerprint": (lambda c: open_frame(c.vocab, c.prompt, vocab_fingerprint=b""),
                       PRECONDITION, "vocabulary mismatch"),
    "empty-prompt": (lambda c: open_frame(c.vocab, []), INVALID, "prompt is empty"),
    "max-new-tokens-0": (lambda c: open_frame(c.vocab, c.prompt, max_new_tokens=0),
                         INVALID, "max_new_tokens must be in [1, 4096], got 0"),
    "max-new-tokens-huge": (lambda c: open_frame(c.vocab, c.prompt, max_new_tokens=2**32 - 1),
                            INVALID, f"max_new_tokens must be in [1, 4096], got {2**32 - 1}"),
    "unknown-mode": (lambda c: open_frame(c.vocab, c.prompt, sampling=_sampling(mode=7)),
                     INVALID, "unknown verification mode 7"),
    "unspecified-mode": (lambda c: open_frame(c.vocab, c.prompt, sampling=pb.Sampling()),
                         INVALID, "unknown verification mode 0"),
    "nan-temperature": (lambda c: open_frame(c.vocab, c.prompt, sampling=_sampling(temperature=float("nan"))),
                        INVALID, "temperature must be a finite number"),
    "top-p-above-1": (lambda c: open_frame(c.vocab, c.prompt, sampling=_sampling(top_p=1.5)),
                      INVALID, "top_p must be in (0, 1]"),
    "draft-top-k-too-big": (
        lambda c: open_frame(c.vocab, c.prompt, sampling=_sampling(
            mode=pb.MODE_REJECTION, draft_top_k=codec.MAX_DRAFT_TOP_K + 1)),
        INVALID, f"exceeds {codec.MAX_DRAFT_TOP_K}"),
    "bad-prompt-payload": (lambda c: open_frame(c.vocab, c.prompt, prompt=_RANDOM, prompt_compressed=True),
                           INVALID, "bad prompt: bad zstd frame in token payload"),
    "unknown-resume-ticket": (lambda c: open_frame(c.vocab, c.prompt, resume_ticket=b"\x01" * 16),
                              grpc.StatusCode.NOT_FOUND, "no resumable session"),
}


@pytest.mark.parametrize("name", list(BAD_OPENS))
def test_bad_first_frame_opens_nothing(stub, tiny_vocab, prompt, name):
    build, code, phrase = BAD_OPENS[name]
    ctx = Ctx(tiny_vocab, prompt)
    responses, got, details = call(stub, [build(ctx), token_draft(0, ctx.P, [], ctx.V), CLOSE])
    assert got == code, (got, details)
    assert phrase in details, details
    assert responses == []


def test_vocabulary_mismatch_names_both_sides(stub, tiny_vocab, tiny_engine, prompt):
    V, fingerprint = tiny_vocab
    wrong_fp = bytes(16)
    _, got, details = call(stub, [open_frame(tiny_vocab, prompt, vocab_size=V + 1, vocab_fingerprint=wrong_fp)])
    assert got == PRECONDITION
    assert "edge" in details and "cloud" in details, details
    assert f"{V + 1} tokens" in details and f"{V} tokens" in details, details
    assert wrong_fp.hex()[:12] in details and fingerprint.hex()[:12] in details, details
    assert tiny_engine.model_name in details, details


def test_truncated_q_block_in_rejection_mode(stub, tiny_vocab, prompt):
    V, P = tiny_vocab[0], len(prompt)
    params = SamplingParams(mode=Mode.REJECTION, temperature=1.0)
    q = [SparseDist(support=np.array([t, 3, 4, 5]), weights=np.array([200, 40, 10, 6]), prob_bits=8)
         for t in (7, 8, 9)]
    block = codec.encode_draft([7, 8, 9], V, q, draft_top_k=params.draft_top_k)
    assert not block.compressed
    for cut in (1, 3, len(block.data) // 2):
        frames = [open_frame(tiny_vocab, prompt, params), raw_draft(0, P, block.data[:-cut]), CLOSE]
        responses, got, details = call(stub, frames)
        assert got == INVALID, (cut, details)
        assert "truncated payload" in details or "trailing bits" in details, (cut, details)
        assert kinds(responses) == ["opened"]
    # The whole block is fine: the session answers it.
    responses, got, _ = call(stub, [open_frame(tiny_vocab, prompt, params), raw_draft(0, P, block.data), CLOSE])
    assert got == grpc.StatusCode.OK and kinds(responses) == ["opened", "verdict"]


def test_ids_at_or_above_the_vocabulary_are_refused(tiny_engine, tiny_vocab, prompt):
    # The tiny vocabulary is 512 = 2**9: no 9-bit id can reach V. A verifier whose
    # engine declares V = 500 (same model and fingerprint) makes ids 500..511
    # representable on the wire.
    engine = copy.copy(tiny_engine)
    engine.vocab_size = 500
    vocab, bits = (500, tiny_vocab[1]), codec.token_bits(500)
    limits = ServiceLimits(max_draft_len=MAX_DRAFT_LEN, session_ttl_s=TTL_S, rejection_to=("all",))
    with BackgroundServer(engine, ServerConfig(port=0, limits=limits)) as small, \
            grpc.insecure_channel(small.address) as ch:
        stub = pb_grpc.VerifierStub(ch)
        block = codec.pack_bits(np.array([7, 505, 8]), bits)
        responses, got, details = call(stub, [open_frame(vocab, prompt), raw_draft(0, len(prompt), block), CLOSE])
        assert got == INVALID and "bad draft block: token id 505 >= vocab size 500" in details, details
        assert kinds(responses) == ["opened"]

        bad_prompt = codec.pack_bits(np.array([*prompt, 499, 511]), bits)
        responses, got, details = call(stub, [open_frame(vocab, prompt, prompt=bad_prompt, prompt_compressed=False)])
        assert got == INVALID and "bad prompt: token id 511 >= vocab size 500" in details, details
        assert responses == []
        assert wait_for_empty_table(small, 2.0) == 0


def test_requested_block_limit_below_the_servers_is_enforced(stub, tiny_vocab, prompt):
    V, P = tiny_vocab[0], len(prompt)
    frames = [open_frame(tiny_vocab, prompt, max_draft_len=4), token_draft(0, P, [7] * 5, V), CLOSE]
    responses, got, details = call(stub, frames)
    assert responses[0].opened.max_draft_len == 4
    assert got == INVALID and "has 5 tokens, limit is 4" in details, details
    # Asking for more than the server allows is clamped, not an error.
    responses, got, _ = call(stub, [open_frame(tiny_vocab, prompt, max_draft_len=1000), CLOSE])
    assert got == grpc.StatusCode.OK and responses[0].opened.max_draft_len == MAX_DRAFT_LEN


def test_past_epoch_blocks_are_answered_stale_and_the_session_goes_on(stub, tiny_vocab, prompt, want):
    V, P = tiny_vocab[0], len(prompt)
    talk = Conversation(stub)
    talk.send(open_frame(tiny_vocab, prompt))
    assert talk.receive().opened.committed_length == P
    # A wrong first draft: rejected, the correction commits, the epoch moves to 1.
    talk.send(token_draft(0, P, [(want[0] + 1) % V], V))
    first = talk.receive().verdict
    assert (first.epoch, first.start_position, first.accepted, first.token, first.bonus) == (0, P, 0, want[0], False)
    # Blocks of the old epoch (a pipelined edge has such in flight; one is garbage, never decoded) are each
    # answered stale, with the next token decoded alone while nothing usable is pending, or empty.
    talk.send(token_draft(0, P + 1, [want[1]], V))
    talk.send(raw_draft(0, P + 1, b"\xff" * 7))
    talk.send(token_draft(1, P + 1, want[1:6], V))  # its first drafts guess those tokens
    stale = [talk.receive().verdict for _ in range(2)]
    filled = [v.token for v in stale if v.HasField("token")]
    assert all(v.stale and v.epoch == 0 and v.accepted == 0 for v in stale)
    assert filled == want[1 : 1 + len(filled)]
    assert [v.start_position for v in stale] == [P + 1, P + 1 + stale[0].HasField("token")]
    # The next correct block is verified past the tokens decoded alone.
    second = talk.receive().verdict
    assert not second.stale and (second.epoch, second.start_position, second.accepted, second.token) == (
        1, P + 1 + len(filled), 5 - len(filled), want[6])
    talk.send(CLOSE)
    assert talk.finish() == (grpc.StatusCode.OK, [])


def test_a_frame_of_empty_blocks_is_answered_block_by_block(stub, tiny_vocab, prompt, want):
    """``Draft.empty_blocks``: each of the frame's blocks gets the verdict a frame of its own would,
    the target's next token, in order."""
    P = len(prompt)
    talk = Conversation(stub)
    talk.send(open_frame(tiny_vocab, prompt))
    opened = talk.receive().opened
    assert (opened.max_empty_blocks, opened.max_blocks_in_flight) == (ServiceLimits.max_empty_blocks,
                                                                      ServiceLimits.max_blocks_in_flight)
    talk.send(pb.EdgeFrame(draft=pb.Draft(epoch=0, start_position=P, empty_blocks=4)))
    verdicts = [talk.receive().verdict for _ in range(4)]
    assert [(v.start_position, v.token, v.stale) for v in verdicts] == [(P + i, want[i], False) for i in range(4)]
    talk.send(CLOSE)
    assert talk.finish() == (grpc.StatusCode.OK, [])


def test_message_over_the_grpc_limit_ends_the_stream(stub, tiny_vocab, prompt):
    P = len(prompt)
    huge = bytes(2 * codec.MAX_PAYLOAD_BYTES)  # over the server's gRPC receive limit, not only the codec's
    frames = [open_frame(tiny_vocab, prompt), raw_draft(0, P, huge), token_draft(0, P, [], tiny_vocab[0]), CLOSE]
    responses, got, details = call(stub, frames)
    assert got in (grpc.StatusCode.RESOURCE_EXHAUSTED, INVALID), (got, details)
    assert "larger than max" in details or "limit" in details, details
    assert kinds(responses) == ["opened"]
    opened = responses[0].opened
    # gRPC drops the message before the servicer sees it; the servicer reads a
    # plain end of stream, as after a broken link, and keeps the session for
    # resumption (up to the TTL). Resume it with its ticket, then close it.
    for _ in range(40):
        responses, got, details = call(stub, [open_frame(tiny_vocab, [], resume_ticket=opened.resume_ticket), CLOSE])
        if got != grpc.StatusCode.NOT_FOUND:  # the server may not have detached it yet
            break
        time.sleep(0.05)
    assert got == grpc.StatusCode.OK, (got, details)
    assert (responses[0].opened.resume_ticket, responses[0].opened.committed_length) == (opened.resume_ticket, P)


# ---------------------------------------------------------------- zstd bombs


def zstd_bomb(window_log: int | None = None) -> bytes:
    """100 MB of zeros as one magicless zstd frame; shared.codec's own parameters unless a window is given."""
    if window_log is None:
        compressor = codec._compressor()  # exactly what shared.codec writes
    else:
        compressor = zstandard.ZstdCompressor(compression_params=zstandard.ZstdCompressionParameters(
            window_log=window_log, compression_level=codec.ZSTD_LEVEL,
            format=zstandard.FORMAT_ZSTD1_MAGICLESS, write_checksum=False, write_content_size=False,
        ))
    return compressor.compress(bytes(100_000_000))


@pytest.fixture(scope="module")
def bombs():
    # The codec's parameters give a 2 MiB window, refused before any output; a
    # 1 KiB window passes that check and has to be stopped by the output cap.
    made = {"codec-params": zstd_bomb(), "1KiB-window": zstd_bomb(window_log=10)}
    assert all(len(bomb) < codec.MAX_PAYLOAD_BYTES for bomb in made.values())
    return made


BOMB_MESSAGES = {"codec-params": "too much memory", "1KiB-window": "decompressed token payload exceeds"}


def test_zstd_bomb_is_refused(stub, tiny_vocab, prompt, bombs):
    P = len(prompt)
    for name, bomb in bombs.items():
        started = time.perf_counter()
        frames = [open_frame(tiny_vocab, prompt), raw_draft(0, P, bomb, compressed=True)]
        responses, got, details = call(stub, frames)
        assert got == INVALID and BOMB_MESSAGES[name] in details, (name, details)
        assert kinds(responses) == ["opened"]
        # As a prompt, too: the Open is refused and nothing is opened.
        responses, got, details = call(stub, [open_frame(tiny_vocab, prompt, prompt=bomb, prompt_compressed=True)])
        assert got == INVALID and responses == [], (name, details)
        assert details.startswith("bad prompt: ") and BOMB_MESSAGES[name] in details, details
        assert time.perf_counter() - started < 5.0, f"{name} took {time.perf_counter() - started:.1f}s"


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_zstd_bombs_keep_memory_bounded(stub, tiny_vocab, prompt, bombs):
    P = len(prompt)
    streams = [[open_frame(tiny_vocab, prompt), raw_draft(0, P, bomb, compressed=True)] for bomb in bombs.values()]
    streams += [[open_frame(tiny_vocab, prompt, prompt=bomb, prompt_compressed=True)] for bomb in bombs.values()]
    for frames in streams:  # warm-up: first-use allocations are not growth
        call(stub, frames)
    gc.collect()
    before = peak = _rss_bytes()
    for i in range(30):
        _, got, _ = call(stub, streams[i % len(streams)])
        assert got == INVALID
        peak = max(peak, _rss_bytes())
    gc.collect()
    after = _rss_bytes()
    assert after - before < 50 << 20, f"RSS grew by {(after - before) >> 20} MiB over 30 bombs"
    assert peak - before < 100 << 20, f"RSS peaked {(peak - before) >> 20} MiB above the start"


# ---------------------------------------------------------------- fuzz


def test_fuzzed_streams_all_end_and_the_server_stays_healthy(stub, channel, tiny_vocab, prompt):
    rng = random.Random(1234)
    hostile = HostileFrames(tiny_vocab[0], tiny_vocab[1], prompt, MAX_DRAFT_LEN, rng)
    endings: dict[str, int] = {}
    opened = 0
    started = time.perf_counter()
    for i in range(200):
        frames = [hostile.random_open()] if rng.random() < 0.7 else []
        frames += [hostile.random_frame() for _ in range(rng.randrange(0, 4))]
        frames.append(CLOSE)  # a session that survives its frames is closed, not left detached
        responses, got, details = call(stub, frames, timeout=10)
        assert got in ALLOWED_ENDINGS, (i, got, details, frames)
        assert got == grpc.StatusCode.OK or details, (i, got)
        opened += "opened" in kinds(responses)
        endings[got.name] = endings.get(got.name, 0) + 1
        if i % 50 == 49:
            assert health_status(channel) == SERVING
    elapsed = time.perf_counter() - started
    # The fuzz got past the Open often enough to mean something.
    assert opened >= 40, (opened, endings)
    assert endings.get("INVALID_ARGUMENT", 0) >= 40 and endings.get("OK", 0) >= 10, endings
    assert elapsed < 60, f"200 fuzzed streams took {elapsed:.0f}s"
    assert health_status(channel) == SERVING
    assert health_status(channel, SERVICE_NAME) == SERVING


# ---------------------------------------------------------------- afterwards (keep last)


def test_honest_sessions_completed_and_no_session_leaked(server, channel, honest):
    honest.stop()
    assert honest.completed >= 2, f"only {honest.completed} honest sessions ran alongside the hostile ones"
    # Every stream here ended with an error or a Close (the one broken stream was
    # resumed and closed), so nothing waits for the TTL: the table is empty now.
    left = wait_for_empty_table(server, 2.0)
    assert left == 0, f"{left} sessions leaked"
    assert health_status(channel) == SERVING
