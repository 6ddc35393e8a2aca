"""Hostile traffic for the verifier: frame generators, and the soak run of ``splitspec bench fuzz``.

``HostileFrames`` makes what an attacker or a broken client sends on a
``Decode`` stream: valid Opens with fields set to edge-case values, drafts
with random payloads, ids, positions and epochs, zstd bombs, payloads over
the codec's limit, messages over gRPC's limit, bytes that are not protobuf at
all, and valid frames with bits flipped. ``run_soak`` sends at least a given
number of such frames on concurrent streams (some opened and abandoned, some
opened and left silent) while an honest edge keeps decoding, and reports what
the service did: how each stream ended, hangs, the honest output, the
server's memory and the sessions left behind.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field

import grpc
from google.protobuf.message import DecodeError

from protos import splitspec_pb2 as pb
from shared import codec
from shared.wire import CHANNEL_OPTIONS, MAX_MESSAGE_BYTES, sampling_to_proto
from sim.experiment.processes import process_rss_mb

__all__ = ["HostileFrames", "SoakReport", "run_soak", "send_raw_stream", "DECODE_METHOD", "ALLOWED_ENDINGS"]

DECODE_METHOD = "/splitspec.v1.Verifier/Decode"
CLOSE = pb.EdgeFrame(close=pb.Close())
# How a hostile stream may end: refused, or served (OK: it closed a session that survived its frames).
# DEADLINE_EXCEEDED: a stream left silent past the idle timeout; CANCELLED: one we abandoned.
# RESOURCE_EXHAUSTED: a full table or client share, or a message over gRPC's size limit.
ALLOWED_ENDINGS = frozenset({
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
})
_WEIRD_UINT32 = [0, 1, 4, 64, 1024, 1025, 2**31, 2**32 - 1]
_WEIRD_FLOATS = [0.0, -0.0, -1.0, 1e-310, 1e-30, 1e-6, 1e30, float("inf"), float("nan")]


class HostileFrames:
    """Random hostile frames for a verifier with vocabulary ``vocab_size`` / ``fingerprint``.

    ``prompt`` is a valid prompt (Opens start from it); ``max_draft_len`` the
    server's block limit. Everything comes from ``rng``: the same seed gives
    the same frames.
    """

    def __init__(self, vocab_size: int, fingerprint: bytes, prompt: list[int], max_draft_len: int,
                 rng: random.Random) -> None:
        self.V, self.fingerprint, self.prompt = vocab_size, fingerprint, list(prompt)
        self.max_draft_len, self.rng = max_draft_len, rng

    @property
    def P(self) -> int:
        return len(self.prompt)

    def valid_open(self, prompt: list[int] | None = None, **fields) -> pb.EdgeFrame:
        """A valid greedy Open for ``prompt`` (default: ours); ``fields`` override any Open field."""
        from shared.params import Mode, SamplingParams

        encoded = codec.encode_tokens(self.prompt if prompt is None else prompt, self.V)
        message = dict(vocab_size=self.V, vocab_fingerprint=self.fingerprint,
                       sampling=sampling_to_proto(SamplingParams(mode=Mode.GREEDY)),
                       prompt=encoded.data, prompt_compressed=encoded.compressed, max_new_tokens=40)
        message.update(fields)
        return pb.EdgeFrame(open=pb.Open(**message))

    def random_open(self) -> pb.EdgeFrame:
        """A valid Open with none, one or a few fields set to random or edge-case values."""
        rng = self.rng
        frame = self.valid_open(self.prompt[: rng.randrange(1, self.P + 1)], max_new_tokens=rng.choice([1, 3, 40]))
        s = frame.open.sampling
        s.CopyFrom(pb.Sampling(mode=rng.choice([pb.MODE_GREEDY, pb.MODE_COUPLED, pb.MODE_REJECTION]),
                               temperature=rng.choice([0.0, 0.7, 1.0]), seed=rng.randrange(2**64)))
        mutations = [
            lambda o: setattr(s, "mode", rng.choice([0, 4, rng.randrange(2**31)])),
            lambda o: setattr(s, "temperature", rng.choice(_WEIRD_FLOATS)),
            lambda o: setattr(s, "top_k", rng.choice([1, 5, self.V, 2**32 - 1])),
            lambda o: setattr(s, "top_p", rng.choice([1e-9, 0.5, 1.5, float("nan"), -1.0])),
            lambda o: setattr(s, "draft_top_k", rng.choice(_WEIRD_UINT32)),
            lambda o: setattr(s, "prob_bits", rng.choice([1, 16, 17, 31, 2**32 - 1])),
            lambda o: setattr(o, "vocab_fingerprint", rng.randbytes(rng.choice([0, 16, 40]))),
            lambda o: setattr(o, "vocab_size", rng.choice(_WEIRD_UINT32)),
            lambda o: setattr(o, "prompt", rng.randbytes(rng.randrange(0, 48))),
            lambda o: setattr(o, "prompt_compressed", True),
            lambda o: setattr(o, "max_new_tokens", rng.choice([0, 4096, 4097, 2**32 - 1])),
            lambda o: setattr(o, "max_draft_len", rng.choice(_WEIRD_UINT32)),
            lambda o: setattr(o, "resume_ticket", rng.randbytes(rng.choice([1, 16]))),
            lambda o: setattr(o, "committed_length", rng.choice([0, 2**64 - 1])),
            lambda o: setattr(o, "extend", True),
        ]
        for mutate in rng.sample(mutations, rng.choice([0, 0, 1, 1, 2, 3])):
            mutate(frame.open)
        return frame

    def random_draft(self) -> pb.EdgeFrame:
        """A draft with random ids (in or out of the vocabulary), payload bytes, position and epoch."""
        rng = self.rng
        pick = rng.random()
        if pick < 0.4:
            n = rng.choice([0, 1, 3, self.max_draft_len, self.max_draft_len + 1])
            encoded = codec.encode_tokens([rng.randrange(self.V) for _ in range(n)], self.V)
            payload, compressed = encoded.data, encoded.compressed
        elif pick < 0.5:  # ids past the vocabulary: pack them at a wider width than token_bits(V)
            wide = codec.encode_tokens([rng.randrange(self.V, 2 * self.V) for _ in range(3)], 2 * self.V)
            payload, compressed = wide.data, wide.compressed
        elif pick < 0.6:
            payload, compressed = self.zstd_bomb(), True
        elif pick < 0.65:
            payload, compressed = bytes(codec.MAX_PAYLOAD_BYTES + rng.randrange(1, 64)), False
        else:
            payload, compressed = rng.randbytes(rng.randrange(0, 64)), rng.random() < 0.5
        return pb.EdgeFrame(draft=pb.Draft(
            epoch=rng.choice([0, 0, 0, 1, 2, 2**64 - 1]),
            start_position=rng.choice([self.P] * 3 + [0, self.P + 1, self.P + 40, 2**64 - 1]),
            payload=payload,
            compressed=compressed,
            more_follows=rng.random() < 0.2,
        ))

    def zstd_bomb(self) -> bytes:
        """A small zstd frame that expands far past the codec's limit."""
        return codec._compressor().compress(bytes(self.rng.choice([1 << 20, 16 << 20])))

    def random_frame(self) -> pb.EdgeFrame:
        """Any frame: random bytes where they parse, an Open, a draft, an empty frame or a Close."""
        rng = self.rng
        if rng.random() < 0.2:
            try:
                return pb.EdgeFrame.FromString(rng.randbytes(rng.randrange(1, 40)))
            except DecodeError:
                pass
        pick = rng.random()
        if pick < 0.15:
            return self.random_open()
        if pick < 0.85:
            return self.random_draft()
        return pb.EdgeFrame() if pick < 0.9 else CLOSE

    def mutated(self, frame: pb.EdgeFrame) -> bytes:
        """``frame`` serialized, then bits flipped, truncated or extended."""
        rng = self.rng
        data = bytearray(frame.SerializeToString())
        pick = rng.random()
        if pick < 0.5 and data:
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif pick < 0.75 and data:
            del data[rng.randrange(len(data)):]
        else:
            data += rng.randbytes(rng.randrange(1, 16))
        return bytes(data)

    def stream(self) -> tuple[list[bytes], str]:
        """One hostile stream: its messages (serialized) and how it ends: ``close`` (Close, then
        half-close), ``half-close``, ``abandon`` (cancelled after its frames) or ``silent``
        (a valid Open, then nothing until the server gives up on it)."""
        rng = self.rng
        ending = rng.choices(["close", "half-close", "abandon", "silent"], weights=[60, 20, 15, 5])[0]
        if ending == "silent":
            return [self.valid_open().SerializeToString()], ending
        messages = [self.random_open().SerializeToString()] if rng.random() < 0.7 else []
        for _ in range(rng.randrange(1, 6)):
            pick = rng.random()
            if pick < 0.1:
                messages.append(rng.randbytes(rng.randrange(1, 64)))  # not protobuf at all
            elif pick < 0.25:
                messages.append(self.mutated(rng.choice([self.valid_open(), self.random_draft()])))
            elif pick < 0.27:
                messages.append(bytes(MAX_MESSAGE_BYTES + 1))  # over gRPC's message limit
            else:
                messages.append(self.random_frame().SerializeToString())
        if ending == "close":
            messages.append(CLOSE.SerializeToString())
        return messages, ending


@dataclass
class SoakReport:
    frames: int = 0  # hostile messages sent
    streams: int = 0
    endings: dict[str, int] = field(default_factory=dict)  # status code name -> streams
    unexpected: list[str] = field(default_factory=list)  # endings outside ALLOWED_ENDINGS, with details
    hangs: int = 0  # streams that outlived their deadline
    honest_sessions: int = 0
    honest_identical: int = 0
    honest_errors: list[str] = field(default_factory=list)
    worst_lockout_s: float = 0.0  # longest an honest Open kept being refused
    rss_before_mb: float | None = None
    rss_after_mb: float | None = None
    rss_peak_mb: float | None = None
    sessions_left: int | None = None  # sessions the service holds once everything ended and expired
    server_alive: bool = True
    elapsed_s: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)


def send_raw_stream(channel: grpc.Channel, messages: list[bytes], ending: str, owner: str,
                 deadline_s: float) -> tuple[grpc.StatusCode, str, bool]:
    """One raw stream: (final code, details, hung)."""
    decode = channel.stream_stream(DECODE_METHOD, request_serializer=lambda b: b,
                                   response_deserializer=pb.CloudFrame.FromString)
    release = threading.Event()

    def requests():
        yield from messages
        if ending == "silent":  # hold the stream open and quiet until the server ends it
            release.wait(deadline_s)

    started = time.monotonic()
    call = decode(requests(), timeout=deadline_s, metadata=(("authorization", f"Bearer {owner}"),))
    try:
        if ending == "abandon":
            time.sleep(0.01)
            call.cancel()
        for _ in call:
            pass
        return grpc.StatusCode.OK, "", False
    except grpc.RpcError as error:
        hung = error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - started >= deadline_s - 0.1
        return error.code(), error.details() or "", hung
    finally:
        release.set()


def run_soak(
    address: str,
    factory: HostileFrames,
    *,
    frames: int,
    honest: Callable[[], bool],
    server_pid: int | None = None,
    sessions_left: Callable[[], int] | None = None,
    attackers: int = 8,
    workers: int = 8,
    deadline_s: float = 30.0,
    progress: Callable[[str], None] = lambda line: None,
) -> SoakReport:
    """Send at least ``frames`` hostile messages on concurrent streams from ``attackers`` identities
    (bearer tokens), while ``honest()`` runs generations (True: output as expected; it raises
    ``TableFull``-like ``RuntimeError``s it could not get past) on a thread.

    ``server_pid``: the service's process, for RSS and liveness. ``sessions_left``: called after
    everything ended, the sessions the service still holds (after its TTL: leaks).
    """
    report = SoakReport()
    if server_pid:
        report.rss_before_mb = report.rss_peak_mb = process_rss_mb(server_pid)
    stop = threading.Event()
    lockout = {"since": None}

    def honest_loop() -> None:
        while not stop.is_set() or report.honest_sessions == 0:
            try:
                ok = honest()
            except RuntimeError as exc:  # refused: count how long it lasts, try again
                if "RESOURCE_EXHAUSTED" not in str(exc):
                    report.honest_errors.append(str(exc))
                    return
                lockout["since"] = lockout["since"] or time.monotonic()
                report.worst_lockout_s = max(report.worst_lockout_s, time.monotonic() - lockout["since"])
                time.sleep(0.1)
                continue
            lockout["since"] = None
            report.honest_sessions += 1
            report.honest_identical += ok

    def watch_memory() -> None:
        while not stop.wait(0.2):
            report.rss_peak_mb = max(report.rss_peak_mb or 0.0, process_rss_mb(server_pid))

    threads = [threading.Thread(target=honest_loop, name="soak-honest", daemon=True)]
    if server_pid:
        threads.append(threading.Thread(target=watch_memory, name="soak-rss", daemon=True))
    for thread in threads:
        thread.start()
    started = time.monotonic()
    endings: Counter = Counter()

    def collect(done) -> None:
        for future in done:
            code, details, hung = future.result()
            endings[code.name] += 1
            report.hangs += hung
            if code not in ALLOWED_ENDINGS:
                report.unexpected.append(f"{code.name}: {details}")

    with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel, ThreadPoolExecutor(workers) as pool:
        pending: set = set()
        next_progress = 1000
        while report.frames < frames:
            messages, ending = factory.stream()
            report.frames += len(messages)
            report.streams += 1
            owner = f"attacker-{factory.rng.randrange(attackers)}"
            pending.add(pool.submit(send_raw_stream, channel, messages, ending, owner, deadline_s))
            if len(pending) >= workers:  # keep ``workers`` streams going; silent ones hold only their own
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                collect(done)
            if report.frames >= next_progress:
                next_progress += 1000
                progress(f"{report.frames} frames on {report.streams} streams; honest sessions "
                         f"{report.honest_sessions}")
        collect(wait(pending).done)
    stop.set()
    for thread in threads:
        thread.join(120)
    report.elapsed_s = time.monotonic() - started
    report.endings = dict(endings)
    if server_pid:
        try:
            report.rss_after_mb = process_rss_mb(server_pid)
        except FileNotFoundError:
            report.server_alive = False
    if sessions_left is not None and report.server_alive:
        report.sessions_left = sessions_left()
    return report


def soak_tiny_service(frames: int, *, seed: int = 0, workers: int = 8, session_ttl_s: float = 10.0,
                      progress: Callable[[str], None] = lambda line: None) -> SoakReport:
    """``run_soak`` against a real ``splitspec-cloud serve`` process on the tiny generated models,
    with an honest greedy edge (the tiny F32 drafter, D = 4) checked against target-only output.

    The service runs with a short session TTL, so that once the soak is over and the TTL has
    passed, ``sessions_left`` counts leaks only.
    """
    import tempfile

    from cloud.engine import TargetEngine
    from edge.decode_loop import run_decode
    from edge.endpoint import VerifierEndpoint
    from edge.grpc_verifier import GrpcVerifier
    from edge.llama_drafter import LlamaDrafter
    from shared.params import Mode, SamplingParams
    from sim.experiment.processes import CloudProcess
    from sim.fixtures.tiny_models import write_tiny_models
    from sim.inprocess import generate

    greedy = SamplingParams(mode=Mode.GREEDY)
    with tempfile.TemporaryDirectory(prefix="splitspec-fuzz-") as tmp:
        paths = write_tiny_models(tmp, seed=0)
        engine = TargetEngine(paths["target"])
        prompt = [1, *engine.tokenizer("The cat sat on the mat.", add_special_tokens=False).input_ids]
        drafter = LlamaDrafter(paths["drafter_f32"], n_ctx=512, n_threads=1, f32_kv_cache=True)
        want = generate(engine, drafter, prompt, greedy, max_new_tokens=40, draft_len=0).tokens
        factory = HostileFrames(engine.vocab_size, engine.fingerprint, prompt, 16, random.Random(seed))
        extra = ["--max-draft-len", "16", "--session-ttl", str(session_ttl_s), "--idle-timeout", "2"]
        try:
            with CloudProcess(paths["target"], None, extra_args=extra) as cloud:
                address = f"127.0.0.1:{cloud.port}"

                def honest() -> bool:
                    verifier = GrpcVerifier(VerifierEndpoint(address, engine.vocab_size, engine.fingerprint),
                                            verdict_timeout_s=30)
                    return run_decode(drafter, verifier, prompt, greedy, max_new_tokens=40, draft_len=4).tokens == want

                def sessions_left() -> int:
                    progress(f"waiting {session_ttl_s:.0f}s (the TTL) for parked sessions to expire")
                    time.sleep(session_ttl_s + 1)
                    honest()  # opening a session reaps the expired ones; its end updates the gauge
                    return int(cloud.metric("splitspec_sessions_active"))

                return run_soak(address, factory, frames=frames, honest=honest, server_pid=cloud.proc.pid,
                                sessions_left=sessions_left, workers=workers, progress=progress)
        finally:
            drafter.close()
