"""Untrusted input on the verifier's wire: a bad frame ends only its own session.

Hand-crafted ``EdgeFrame``s go to a real server over loopback through a raw
stub. Each hostile stream must end with the right status and a message that
says what was wrong, and nothing else: no verdict, no hang, no leaked session,
no unbounded memory. Meanwhile an honest edge (``GrpcLink`` + ``run_decode``
with the tiny F32 drafter) decodes against the same server, again and again,
and must keep producing exactly the target-only tokens.
"""

from __future__ import annotations

import copy
import gc
import queue
import random
import threading
import time

import grpc
import numpy as np
import pytest
import zstandard
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cloud.server import SERVICE_NAME, BackgroundServer, ServerConfig
from cloud.servicer import ServiceLimits
from edge.client import GrpcLink
from edge.decode_loop import run_decode
from edge.llama_drafter import LlamaDrafter
from protos import splitspec_pb2 as pb
from protos import splitspec_pb2_grpc as pb_grpc
from shared import codec
from shared.params import Mode, SamplingParams
from shared.sparse import SparseDist
from shared.wire import sampling_to_proto
from sim.inprocess import generate

BOS = 1
PROMPT_TEXT = "The cat sat on the mat."
MAX_DRAFT_LEN = 16  # the server's limit, as in the shared `verifier` fixture
TTL_S = 30.0  # as in the shared fixture; long enough that a leaked session outlives the module
NEW_TOKENS = 40
GREEDY = SamplingParams(mode=Mode.GREEDY)
CALL_TIMEOUT_S = 15.0  # every hostile call has a deadline: a hang fails the test, it never blocks it
ALLOWED_ENDINGS = {  # what a stream of arbitrary frames may end with
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
}


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def server(tiny_engine):
    """One verifier for the whole module, so the honest session spans every hostile case.

    Same limits as the shared ``verifier`` fixture (D <= 16, TTL 30 s).
    """
    limits = ServiceLimits(max_draft_len=MAX_DRAFT_LEN, session_ttl_s=TTL_S)
    with BackgroundServer(tiny_engine, ServerConfig(port=0, limits=limits)) as running:
        yield running


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
    drafter = LlamaDrafter(tiny_models["drafter_f32"], n_ctx=512, n_threads=1, f32_kv_cache=True)
    try:
        result = generate(tiny_engine, drafter, prompt, GREEDY, max_new_tokens=NEW_TOKENS, draft_len=0)
    finally:
        drafter.close()
    assert len(result.tokens) == NEW_TOKENS
    return result.tokens


class HonestTraffic:
    """Honest edge sessions against the server, back to back, on a thread, until stopped."""

    def __init__(self, address, drafter, vocab, prompt, want) -> None:
        self.address, self.drafter, self.vocab, self.prompt, self.want = address, drafter, vocab, prompt, want
        self.completed = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="honest-edge", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self.errors and (self.completed == 0 or not self._stop.is_set()):
            link = GrpcLink(
                self.address, vocab_size=self.vocab[0], fingerprint=self.vocab[1],
                connect_timeout_s=10, verdict_timeout_s=30,
            )
            try:
                result = run_decode(
                    self.drafter, link, self.prompt, GREEDY, max_new_tokens=NEW_TOKENS, draft_len=4
                )
            except Exception as exc:  # noqa: BLE001 - any failure is what we report
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
    drafter = LlamaDrafter(tiny_models["drafter_f32"], n_ctx=512, n_threads=1, f32_kv_cache=True)
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
    """A valid Open for ``prompt_tokens``; ``fields`` override any Open field (``prompt`` included)."""
    encoded = codec.encode_tokens(prompt_tokens, vocab[0])
    message = dict(
        vocab_size=vocab[0], vocab_fingerprint=vocab[1], sampling=sampling_to_proto(params),
        prompt=encoded.data, prompt_compressed=encoded.compressed, max_new_tokens=NEW_TOKENS,
    )
    message.update(fields)
    return pb.EdgeFrame(open=pb.Open(**message))


def draft_frame(epoch, start, tokens=None, *, vocab_size=None, payload=None, compressed=False) -> pb.EdgeFrame:
    if tokens is not None:
        encoded = codec.encode_tokens(tokens, vocab_size)
        payload, compressed = encoded.data, encoded.compressed
    return pb.EdgeFrame(draft=pb.Draft(epoch=epoch, start_position=start, payload=payload, compressed=compressed))


CLOSE = pb.EdgeFrame(close=pb.Close())


def call(stub, frames, timeout=CALL_TIMEOUT_S) -> tuple[list[pb.CloudFrame], grpc.StatusCode, str]:
    """Send ``frames``, then half-close; (every frame received, final code, details)."""
    responses = []
    stream = stub.Decode(iter(frames), timeout=timeout)
    try:
        for response in stream:
            responses.append(response)
    except grpc.RpcError as error:
        return responses, error.code(), error.details() or ""
    return responses, grpc.StatusCode.OK, ""


class Conversation:
    """A Decode stream driven frame by frame (for cases that need the server's answers)."""

    def __init__(self, stub, timeout=CALL_TIMEOUT_S) -> None:
        self._frames: queue.Queue = queue.Queue()
        self.stream = stub.Decode(iter(self._frames.get, None), timeout=timeout)

    def send(self, frame) -> None:
        self._frames.put(frame)

    def receive(self) -> pb.CloudFrame:
        return next(self.stream)

    def finish(self) -> grpc.StatusCode:
        self._frames.put(None)
        try:
            rest = list(self.stream)
        except grpc.RpcError as error:
            return error.code()
        assert rest == [], rest
        return grpc.StatusCode.OK


def health_status(channel, service="") -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def wait_for_empty_table(server, timeout_s: float) -> int:
    """Sessions left in the server's table once ``timeout_s`` has passed or it emptied."""
    table = server.server.servicer.table
    deadline = time.monotonic() + timeout_s
    while len(table) and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(table)


def zstd_bomb(window_log: int | None = None) -> bytes:
    """100 MB of zeros as one magicless zstd frame (codec's parameters unless a window is given)."""
    if window_log is None:
        compressor = codec._compressor()  # exactly what shared.codec writes
    else:
        compressor = zstandard.ZstdCompressor(
            compression_params=zstandard.ZstdCompressionParameters(
                window_log=window_log, compression_level=codec.ZSTD_LEVEL,
                format=zstandard.FORMAT_ZSTD1_MAGICLESS, write_checksum=False, write_content_size=False,
            )
        )
    return compressor.compress(bytes(100_000_000))


@pytest.fixture(scope="module")
def bombs():
    # The codec's own parameters give a 2 MiB window, refused before any output;
    # a 1 KiB window passes that check and has to be stopped by the output cap.
    made = {"codec-params": zstd_bomb(), "1KiB-window": zstd_bomb(window_log=10)}
    assert all(len(b) < codec.MAX_PAYLOAD_BYTES for b in made.values())
    return made


# ---------------------------------------------------------------- one bad frame per stream


# Bad frames inside an open session: name -> (frames after the Open, given (vocab, prompt); code; phrase).
_RANDOM = np.random.default_rng(0).bytes(64)
BAD_DRAFTS = {
    "random-bytes-as-zstd": (lambda v, p: [draft_frame(0, len(p), payload=_RANDOM, compressed=True)],
                             grpc.StatusCode.INVALID_ARGUMENT, "bad zstd frame"),
    "random-bytes-raw": (lambda v, p: [draft_frame(0, len(p), payload=_RANDOM)],  # 64 bytes: 56 ids at 9 bits
                         grpc.StatusCode.INVALID_ARGUMENT, f"limit is {MAX_DRAFT_LEN}"),
    "truncated-zstd": (lambda v, p: [draft_frame(0, len(p), payload=_truncated_zstd(v[0]), compressed=True)],
                       grpc.StatusCode.INVALID_ARGUMENT, "truncated payload"),
    "trailing-garbage": (lambda v, p: [draft_frame(0, len(p), payload=codec.encode_tokens([3, 4], v[0]).data + b"\xff")],
                         grpc.StatusCode.INVALID_ARGUMENT, "trailing bits are not zero"),
    "payload-over-limit": (lambda v, p: [draft_frame(0, len(p), payload=bytes(codec.MAX_PAYLOAD_BYTES + 1))],
                           grpc.StatusCode.INVALID_ARGUMENT, f"limit is {codec.MAX_PAYLOAD_BYTES}"),
    "block-too-long": (lambda v, p: [draft_frame(0, len(p), [7] * (MAX_DRAFT_LEN + 1), vocab_size=v[0])],
                       grpc.StatusCode.INVALID_ARGUMENT, f"{MAX_DRAFT_LEN + 1} tokens, limit is {MAX_DRAFT_LEN}"),
    "wrong-start-position": (lambda v, p: [draft_frame(0, len(p) + 3, [7, 8], vocab_size=v[0])],
                             grpc.StatusCode.INVALID_ARGUMENT, "block starts at position"),
    "start-position-2**64-1": (lambda v, p: [draft_frame(0, 2**64 - 1, [7], vocab_size=v[0])],
                               grpc.StatusCode.INVALID_ARGUMENT, f"starts at position {2**64 - 1}"),
    "future-epoch": (lambda v, p: [draft_frame(3, len(p), [7, 8], vocab_size=v[0])],
                     grpc.StatusCode.INVALID_ARGUMENT, "epoch 3 is ahead of the session's epoch 0"),
    "second-open": (lambda v, p: [open_frame(v, p)], grpc.StatusCode.INVALID_ARGUMENT, "unexpected open frame"),
    "empty-frame": (lambda v, p: [pb.EdgeFrame()], grpc.StatusCode.INVALID_ARGUMENT, "unexpected"),
}


def _truncated_zstd(vocab_size: int) -> bytes:
    raw = codec.encode_tokens([5] * MAX_DRAFT_LEN, vocab_size).data
    return codec._compressor().compress(raw)[:-3]  # a valid frame, cut short


@pytest.mark.parametrize("name", list(BAD_DRAFTS))
def test_bad_frame_in_an_open_session_ends_it(stub, tiny_vocab, prompt, name):
    build, code, phrase = BAD_DRAFTS[name]
    # A trailing correct block must never be answered: the stream ended at the bad frame.
    good = draft_frame(0, len(prompt), [], vocab_size=tiny_vocab[0])
    responses, got, details = call(stub, [open_frame(tiny_vocab, prompt), *build(tiny_vocab, prompt), good, CLOSE])
    assert got == code, (got, details)
    assert phrase in details, details
    assert [r.WhichOneof("kind") for r in responses] == ["opened"]


def test_truncated_q_block_in_rejection_mode(stub, tiny_vocab, prompt):
    V, P = tiny_vocab[0], len(prompt)
    params = SamplingParams(mode=Mode.REJECTION, temperature=1.0)
    q = [SparseDist(support=np.array([t, 3, 4, 5]), weights=np.array([200, 40, 10, 6]), prob_bits=8) for t in (7, 8, 9)]
    block = codec.encode_draft([7, 8, 9], V, q, draft_top_k=params.draft_top_k)
    assert not block.compressed
    for cut in (1, 3, len(block.data) // 2):
        responses, got, details = call(stub, [open_frame(tiny_vocab, prompt, params),
                                              draft_frame(0, P, payload=block.data[:-cut]), CLOSE])
        assert got == grpc.StatusCode.INVALID_ARGUMENT, (cut, details)
        assert "truncated payload" in details or "trailing bits" in details, (cut, details)
        assert [r.WhichOneof("kind") for r in responses] == ["opened"]
    # The whole block is fine: the session answers it.
    responses, got, _ = call(stub, [open_frame(tiny_vocab, prompt, params), draft_frame(0, P, payload=block.data), CLOSE])
    assert got == grpc.StatusCode.OK and [r.WhichOneof("kind") for r in responses] == ["opened", "verdict"]


def _sampling(**fields) -> pb.Sampling:
    return pb.Sampling(**{"mode": pb.MODE_COUPLED, "temperature": 1.0, **fields})


_WRONG_FP = bytes(range(16))
# Bad first frames: name -> (frame, given (vocab, prompt); code; phrase). Nothing may be opened.
BAD_OPENS = {
    "draft-before-open": (lambda v, p: draft_frame(0, len(p), [7], vocab_size=v[0]),
                          grpc.StatusCode.INVALID_ARGUMENT, "the first frame must be Open, got draft"),
    "close-before-open": (lambda v, p: CLOSE, grpc.StatusCode.INVALID_ARGUMENT, "the first frame must be Open, got close"),
    "wrong-vocab-size": (lambda v, p: open_frame(v, p, vocab_size=v[0] - 1),
                         grpc.StatusCode.FAILED_PRECONDITION, "vocabulary mismatch: edge"),
    "wrong-fingerprint": (lambda v, p: open_frame(v, p, vocab_fingerprint=_WRONG_FP),
                          grpc.StatusCode.FAILED_PRECONDITION, f"fingerprint {_WRONG_FP.hex()[:12]}"),
    "no-fingerprint": (lambda v, p: open_frame(v, p, vocab_fingerprint=b""),
                       grpc.StatusCode.FAILED_PRECONDITION, "vocabulary mismatch"),
    "empty-prompt": (lambda v, p: open_frame(v, []), grpc.StatusCode.INVALID_ARGUMENT, "prompt is empty"),
    "max-new-tokens-0": (lambda v, p: open_frame(v, p, max_new_tokens=0),
                         grpc.StatusCode.INVALID_ARGUMENT, "max_new_tokens must be in [1, 4096], got 0"),
    "max-new-tokens-huge": (lambda v, p: open_frame(v, p, max_new_tokens=2**32 - 1),
                            grpc.StatusCode.INVALID_ARGUMENT, "max_new_tokens must be in [1, 4096]"),
    "unknown-mode": (lambda v, p: open_frame(v, p, sampling=_sampling(mode=7)),
                     grpc.StatusCode.INVALID_ARGUMENT, "unknown verification mode 7"),
    "unspecified-mode": (lambda v, p: open_frame(v, p, sampling=pb.Sampling()),
                         grpc.StatusCode.INVALID_ARGUMENT, "unknown verification mode 0"),
    "nan-temperature": (lambda v, p: open_frame(v, p, sampling=_sampling(temperature=float("nan"))),
                        grpc.StatusCode.INVALID_ARGUMENT, "temperature"),
    "top-p-above-1": (lambda v, p: open_frame(v, p, sampling=_sampling(top_p=1.5)),
                      grpc.StatusCode.INVALID_ARGUMENT, "top_p"),
    "draft-top-k-too-big": (lambda v, p: open_frame(v, p, sampling=_sampling(
                                mode=pb.MODE_REJECTION, draft_top_k=codec.MAX_DRAFT_TOP_K + 1)),
                            grpc.StatusCode.INVALID_ARGUMENT, f"exceeds {codec.MAX_DRAFT_TOP_K}"),
    "bad-prompt-payload": (lambda v, p: open_frame(v, p, prompt=_RANDOM, prompt_compressed=True),
                           grpc.StatusCode.INVALID_ARGUMENT, "bad prompt: bad zstd frame in token payload"),
    "unknown-resume-ticket": (lambda v, p: open_frame(v, p, resume_ticket=b"\x01" * 16),
                              grpc.StatusCode.NOT_FOUND, "no resumable session"),
}


@pytest.mark.parametrize("name", list(BAD_OPENS))
def test_bad_first_frame_opens_nothing(stub, tiny_vocab, prompt, name):
    build, code, phrase = BAD_OPENS[name]
    after = [draft_frame(0, len(prompt), [], vocab_size=tiny_vocab[0]), CLOSE]
    responses, got, details = call(stub, [build(tiny_vocab, prompt), *after])
    assert got == code, (got, details)
    assert phrase in details, details
    assert responses == []


def test_vocabulary_mismatch_names_both_sides(stub, tiny_vocab, tiny_engine, prompt):
    V, fingerprint = tiny_vocab
    wrong_fp = bytes(16)
    _, got, details = call(stub, [open_frame(tiny_vocab, prompt, vocab_size=V + 1, vocab_fingerprint=wrong_fp)])
    assert got == grpc.StatusCode.FAILED_PRECONDITION
    assert "edge" in details and "cloud" in details, details
    assert f"{V + 1} tokens" in details and f"{V} tokens" in details, details
    assert wrong_fp.hex()[:12] in details and fingerprint.hex()[:12] in details, details
    assert tiny_engine.model_name in details, details


def test_ids_at_or_above_the_vocabulary_are_refused(tiny_engine, tiny_vocab, prompt):
    # The tiny vocabulary is 512 = 2**9, so no 9-bit id can reach V. A verifier
    # whose engine declares V = 500 (same model, same fingerprint) makes ids
    # 500..511 representable on the wire.
    engine = copy.copy(tiny_engine)
    engine.vocab_size = 500
    vocab = (500, tiny_vocab[1])
    limits = ServiceLimits(max_draft_len=MAX_DRAFT_LEN, session_ttl_s=TTL_S)
    with BackgroundServer(engine, ServerConfig(port=0, limits=limits)) as small, \
            grpc.insecure_channel(small.address) as ch:
        stub = pb_grpc.VerifierStub(ch)
        bad_block = codec.pack_bits(np.array([7, 505, 8]), codec.token_bits(500))
        responses, got, details = call(stub, [open_frame(vocab, prompt), draft_frame(0, len(prompt), payload=bad_block), CLOSE])
        assert got == grpc.StatusCode.INVALID_ARGUMENT
        assert "token id 505 >= vocab size 500" in details, details
        assert [r.WhichOneof("kind") for r in responses] == ["opened"]

        bad_prompt = codec.pack_bits(np.array([*prompt, 499, 511]), codec.token_bits(500))
        responses, got, details = call(stub, [open_frame(vocab, prompt, prompt=bad_prompt, prompt_compressed=False)])
        assert got == grpc.StatusCode.INVALID_ARGUMENT
        assert "bad prompt: token id 511 >= vocab size 500" in details, details
        assert responses == []
        assert wait_for_empty_table(small, 2.0) == 0


def test_requested_block_limit_below_the_servers_is_enforced(stub, tiny_vocab, prompt):
    V, P = tiny_vocab[0], len(prompt)
    responses, got, details = call(
        stub, [open_frame(tiny_vocab, prompt, max_draft_len=4), draft_frame(0, P, [7] * 5, vocab_size=V), CLOSE]
    )
    assert responses[0].opened.max_draft_len == 4
    assert got == grpc.StatusCode.INVALID_ARGUMENT and "limit is 4" in details, details
    # Asking for more than the server allows is clamped, not an error.
    responses, got, _ = call(stub, [open_frame(tiny_vocab, prompt, max_draft_len=1000), CLOSE])
    assert got == grpc.StatusCode.OK and responses[0].opened.max_draft_len == MAX_DRAFT_LEN


def test_past_epoch_is_dropped_and_the_session_goes_on(stub, tiny_vocab, prompt, want):
    V, P = tiny_vocab[0], len(prompt)
    talk = Conversation(stub)
    talk.send(open_frame(tiny_vocab, prompt))
    assert talk.receive().opened.committed_length == P
    # A wrong first draft: rejected at once, the correction commits, the epoch moves to 1.
    talk.send(draft_frame(0, P, [(want[0] + 1) % V], vocab_size=V))
    first = talk.receive().verdict
    assert (first.epoch, first.start_position, first.accepted, first.token, first.bonus) == (0, P, 0, want[0], False)
    # A block of the old epoch (as a pipelined edge would have in flight) is silently dropped ...
    talk.send(draft_frame(0, P + 1, [want[1]], vocab_size=V))
    talk.send(draft_frame(0, P + 1, [(want[1] + 1) % V, 9, 9], vocab_size=V))
    # ... and the next correct block gets the next frame on the stream: its verdict.
    talk.send(draft_frame(1, P + 1, want[1:3], vocab_size=V))
    second = talk.receive().verdict
    assert (second.epoch, second.start_position, second.accepted, second.token, second.bonus) == (1, P + 1, 2, want[3], True)
    talk.send(CLOSE)
    assert talk.finish() == grpc.StatusCode.OK


def test_message_over_the_grpc_limit_ends_the_stream(stub, tiny_vocab, prompt):
    P = len(prompt)
    huge = bytes(2 * codec.MAX_PAYLOAD_BYTES)  # over the server's max receive size, not only the codec's
    responses, got, details = call(stub, [open_frame(tiny_vocab, prompt), draft_frame(0, P, payload=huge),
                                          draft_frame(0, P, [], vocab_size=tiny_vocab[0]), CLOSE])
    assert got in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INVALID_ARGUMENT), (got, details)
    assert "larger than max" in details or "limit" in details, details
    assert [r.WhichOneof("kind") for r in responses] == ["opened"]
    opened = responses[0].opened
    # gRPC drops the message before the servicer sees it; the servicer reads a
    # plain end of stream, as after a broken link, and keeps the session for
    # resumption (until the TTL). Resume it with its ticket, then close it.
    for _ in range(40):
        responses, got, details = call(stub, [open_frame(tiny_vocab, [], resume_ticket=opened.resume_ticket), CLOSE])
        if got != grpc.StatusCode.NOT_FOUND:  # the server may not have detached it yet
            break
        time.sleep(0.05)
    assert got == grpc.StatusCode.OK, (got, details)
    assert responses[0].opened.session_id == opened.session_id
    assert responses[0].opened.committed_length == P


def test_zstd_bomb_is_refused(stub, tiny_vocab, prompt, bombs):
    P = len(prompt)
    for name, bomb in bombs.items():
        started = time.perf_counter()
        responses, got, details = call(stub, [open_frame(tiny_vocab, prompt), draft_frame(0, P, payload=bomb, compressed=True)])
        assert got == grpc.StatusCode.INVALID_ARGUMENT, (name, details)
        assert ("too much memory" in details) if name == "codec-params" else ("decompressed token payload exceeds" in details), details
        assert [r.WhichOneof("kind") for r in responses] == ["opened"]
        # As a prompt, too: the Open is refused and nothing is opened.
        responses, got, details = call(stub, [open_frame(tiny_vocab, prompt, prompt=bomb, prompt_compressed=True)])
        assert got == grpc.StatusCode.INVALID_ARGUMENT and responses == [], (name, details)
        assert details.startswith("bad prompt: "), details
        assert time.perf_counter() - started < 5.0, f"{name} took {time.perf_counter() - started:.1f}s"


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_zstd_bombs_keep_memory_bounded(stub, tiny_vocab, prompt, bombs):
    P = len(prompt)
    frames = [[open_frame(tiny_vocab, prompt), draft_frame(0, P, payload=bomb, compressed=True)] for bomb in bombs.values()]
    frames += [[open_frame(tiny_vocab, prompt, prompt=bomb, prompt_compressed=True)] for bomb in bombs.values()]
    for stream in frames:  # warm-up: first-use allocations are not growth
        call(stub, stream)
    gc.collect()
    before = _rss_bytes()
    peak = before
    for i in range(30):
        _, got, _ = call(stub, frames[i % len(frames)])
        assert got == grpc.StatusCode.INVALID_ARGUMENT
        peak = max(peak, _rss_bytes())
    gc.collect()
    after = _rss_bytes()
    assert after - before < 50 << 20, f"RSS grew by {(after - before) >> 20} MiB over 30 bombs"
    assert peak - before < 100 << 20, f"RSS peaked {(peak - before) >> 20} MiB above the start"


# ---------------------------------------------------------------- fuzz


_WEIRD_FLOATS = [1e-30, 1e-6, 1e30, float("nan"), float("inf"), -1.0, -0.0]
_WEIRD_UINT32 = [0, 1, 4, 64, 1024, 1025, 2**31, 2**32 - 1]


def _random_open(rng: random.Random, vocab, prompt) -> pb.EdgeFrame:
    """A valid Open with none, one or a few fields set to random or edge-case values."""
    V = vocab[0]
    mode = rng.choice([pb.MODE_GREEDY, pb.MODE_COUPLED, pb.MODE_REJECTION])
    sampling = pb.Sampling(mode=mode, temperature=rng.choice([0.0, 0.7, 1.0]), seed=rng.randrange(2**64))
    frame = open_frame(vocab, prompt[: rng.randrange(1, len(prompt) + 1)], max_new_tokens=rng.choice([1, 3, 40]))
    frame.open.sampling.CopyFrom(sampling)
    mutations = [
        lambda o: setattr(o.sampling, "mode", rng.choice([0, 4, rng.randrange(2**31)])),
        lambda o: setattr(o.sampling, "temperature", rng.choice(_WEIRD_FLOATS)),
        lambda o: setattr(o.sampling, "top_k", rng.choice([1, 5, V, 2**32 - 1])),
        lambda o: setattr(o.sampling, "top_p", rng.choice([1e-9, 0.5, 1.5, float("nan"), -1.0])),
        lambda o: setattr(o.sampling, "draft_top_k", rng.choice(_WEIRD_UINT32)),
        lambda o: setattr(o.sampling, "prob_bits", rng.choice([1, 16, 17, 31, 2**32 - 1])),
        lambda o: setattr(o, "vocab_fingerprint", rng.randbytes(rng.choice([0, 16, 40]))),
        lambda o: setattr(o, "vocab_size", rng.choice(_WEIRD_UINT32)),
        lambda o: setattr(o, "prompt", rng.randbytes(rng.randrange(0, 48))),
        lambda o: setattr(o, "prompt_compressed", True),
        lambda o: setattr(o, "max_new_tokens", rng.choice([0, 4096, 4097, 2**32 - 1])),
        lambda o: setattr(o, "max_draft_len", rng.choice(_WEIRD_UINT32)),
        lambda o: setattr(o, "resume_ticket", rng.randbytes(rng.choice([1, 16]))),
        lambda o: setattr(o, "committed_length", rng.choice([0, 2**64 - 1])),
        lambda o: setattr(o, "model", "x" * rng.choice([1, 5000])),
    ]
    for mutate in rng.sample(mutations, rng.choice([0, 0, 1, 1, 2, 3])):
        mutate(frame.open)
    return frame


def _random_draft(rng: random.Random, vocab, prompt) -> pb.EdgeFrame:
    V = vocab[0]
    if rng.random() < 0.5:
        encoded = codec.encode_tokens([rng.randrange(V) for _ in range(rng.randrange(0, 20))], V)
        payload, compressed = encoded.data, encoded.compressed
    else:
        payload, compressed = rng.randbytes(rng.randrange(0, 64)), rng.random() < 0.5
    return pb.EdgeFrame(draft=pb.Draft(
        epoch=rng.choice([0, 0, 0, 1, 2**64 - 1]),
        start_position=rng.choice([len(prompt)] * 3 + [0, len(prompt) + 1, 2**64 - 1]),
        payload=payload,
        compressed=compressed,
        more_follows=rng.random() < 0.2,
    ))


def _random_frame(rng: random.Random, vocab, prompt) -> pb.EdgeFrame:
    """Random bytes parsed leniently where they parse, else random field values."""
    if rng.random() < 0.3:
        try:
            return pb.EdgeFrame.FromString(rng.randbytes(rng.randrange(1, 40)))
        except DecodeError:
            pass
    pick = rng.random()
    if pick < 0.2:
        return _random_open(rng, vocab, prompt)
    if pick < 0.9:
        return _random_draft(rng, vocab, prompt)
    return CLOSE


def test_fuzzed_streams_all_end_and_the_server_stays_healthy(stub, channel, server, honest, tiny_vocab, prompt):
    rng = random.Random(1234)
    endings: dict[str, int] = {}
    opened = 0
    started = time.perf_counter()
    for i in range(200):
        frames = [_random_open(rng, tiny_vocab, prompt)] if rng.random() < 0.7 else []
        frames += [_random_frame(rng, tiny_vocab, prompt) for _ in range(rng.randrange(0, 4))]
        frames.append(CLOSE)  # an honest end: a session that survives its frames is closed, not detached
        responses, got, details = call(stub, frames, timeout=10)
        assert got in ALLOWED_ENDINGS, (i, got, details, frames)
        if got != grpc.StatusCode.OK:
            assert details, (i, got)
        opened += any(r.WhichOneof("kind") == "opened" for r in responses)
        endings[got.name] = endings.get(got.name, 0) + 1
        if i % 50 == 49:
            assert health_status(channel) == health_pb2.HealthCheckResponse.SERVING
    elapsed = time.perf_counter() - started
    # The fuzz reached past the Open often enough to mean something.
    assert opened >= 40, (opened, endings)
    assert endings.get("INVALID_ARGUMENT", 0) >= 40 and endings.get("OK", 0) >= 10, endings
    assert elapsed < 60, f"200 fuzzed streams took {elapsed:.0f}s"
    assert health_status(channel) == health_pb2.HealthCheckResponse.SERVING
    assert health_status(channel, SERVICE_NAME) == health_pb2.HealthCheckResponse.SERVING


# ---------------------------------------------------------------- afterwards (keep last)


def test_honest_sessions_completed_and_no_session_leaked(server, channel, honest):
    honest.stop()
    assert honest.completed >= 2, f"only {honest.completed} honest sessions ran alongside the hostile ones"
    # Every stream here ended with an error or a Close (the one broken stream was
    # resumed and closed), so nothing may wait for the TTL: the table is empty now.
    left = wait_for_empty_table(server, 2.0)
    assert left == 0, f"{left} sessions leaked: {list(server.server.servicer.table._by_ticket.values())}"
    assert health_status(channel) == health_pb2.HealthCheckResponse.SERVING
