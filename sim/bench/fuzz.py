"""Hostile traffic for the verifier: the soak run of ``splitspec bench fuzz``.

The frames come from ``sim.bench.hostile_frames`` (``HostileFrames``,
``ForgingDrafter``). ``run_soak`` sends at least a given
number of such frames on concurrent streams (some opened and abandoned, some
opened and left silent) while an honest edge keeps decoding, and reports what
the service did: how each stream ended, hangs, the honest output, the
server's memory and the sessions left behind.
"""

from __future__ import annotations

import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

import grpc

from edge.endpoint import VerifierEndpoint
from edge.schedule import SpecConfig
from protos import splitspec_pb2 as pb
from shared.wire import CHANNEL_OPTIONS, MAX_MESSAGE_BYTES
from sim.bench.hostile_frames import CLOSE, ForgingDrafter, HostileFrames
from sim.experiment.processes import process_rss_mb

__all__ = [
    "FuzzPlan", "SoakReport", "run_soak", "send_raw_stream", "DECODE_METHOD", "ALLOWED_ENDINGS",
    "send_forged_stream", "run_shaped_forgery", "ShapedOutcome",
    "GENERATE_METHOD", "hostile_generate_request", "send_raw_generate", "fuzz_generate",
]

DECODE_METHOD = "/splitspec.v1.Verifier/Decode"
GENERATE_METHOD = "/splitspec.v1.Verifier/Generate"
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
    # Forged rejection-mode drafts (``HostileFrames.forged_stream``, ``run_shaped_forgery``):
    forged_streams: int = 0
    forged_blocks: int = 0
    forged_accepted: int = 0  # naive forged blocks answered with a verdict, not refused (must be 0)
    forged_refused: int = 0  # streams ended INVALID_ARGUMENT "draft not sampled from its q̃"
    shaped_sessions: int = 0
    shaped_ended: int = 0  # ... ended by the draft audit (others finished first: EOS, or their length)
    # Over every shaped forgery, ended by the audit or not (one that samples EOS first ends there: the
    # session's coins are keyed on a secret of the verifier's, so where is not the forger's to choose):
    shaped_undetected_positions: int | None = None  # most positions a shaped forgery ran before its end
    shaped_low_weight_positions: int | None = None  # most drafts at q̃ weight <= 2^-8 before its end ("tail")
    # Hostile unary Generate requests (``fuzz_generate``); their odd endings and hangs count above too:
    generate_requests: int = 0
    generate_endings: dict[str, int] = field(default_factory=dict)  # status code name -> requests

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


def send_forged_stream(channel: grpc.Channel, messages: list[bytes], blocks: int, owner: str,
                       deadline_s: float) -> tuple[grpc.StatusCode, str, int]:
    """One stream of forged blocks, held open until the service ends it or has answered every block
    (a Close that arrived with the blocks would leave them unverified): (code, details, verdicts)."""
    decode = channel.stream_stream(DECODE_METHOD, request_serializer=lambda b: b,
                                   response_deserializer=pb.CloudFrame.FromString)
    answered = threading.Event()

    def requests():
        yield from messages
        answered.wait(deadline_s)
        yield CLOSE.SerializeToString()

    verdicts = 0
    call = decode(requests(), timeout=deadline_s, metadata=(("authorization", f"Bearer {owner}"),))
    try:
        for frame in call:
            verdicts += frame.WhichOneof("kind") == "verdict"
            if verdicts >= blocks or frame.verdict.done:
                answered.set()
        return grpc.StatusCode.OK, "", verdicts
    except grpc.RpcError as error:
        return error.code(), error.details() or "", verdicts
    finally:
        answered.set()


class ShapedOutcome(NamedTuple):
    positions: int  # positions it drafted through the one at which the service ended it (or it finished)
    low_weight: int  # of those, the ones it drafted at q̃ weight <= 2^-8
    ended: bool  # the draft audit ended it (False: it finished first)
    message: str


def run_shaped_forgery(endpoint: VerifierEndpoint, prompt: list[int], *, seed: int, strategy: str = "shaped",
                       draft_top_k: int = 16, max_new_tokens: int = 400, draft_len: int = 4) -> ShapedOutcome:
    """A rejection-mode session driven by a ``ForgingDrafter`` (``strategy``) through the real edge
    loop to ``endpoint``, until the service ends it or it finishes."""
    from edge.decode_loop import run_decode
    from edge.grpc_verifier import GrpcVerifier
    from edge.verifier_protocol import VerifierError
    from shared.params import Mode, SamplingParams

    params = SamplingParams(mode=Mode.REJECTION, temperature=1.0, seed=seed, draft_top_k=draft_top_k, prob_bits=8)
    # The token it wants at each position: an id away from the special ones (an EOS would end it first).
    vocab_size = endpoint.vocab_size
    drafter = ForgingDrafter(vocab_size, lambda position: 3 + (position * 7919 + seed) % (vocab_size - 3),
                             strategy, seed)
    verifier = GrpcVerifier(endpoint, verdict_timeout_s=30, outage_budget_s=0)
    try:
        result = run_decode(drafter, verifier, prompt, params, max_new_tokens=max_new_tokens,
                            spec=SpecConfig(draft_len))
    except VerifierError as error:
        ended = re.search(r"position (\d+)", str(error))  # the audit names the position it stopped at
        if ended is None or "INVALID_ARGUMENT" not in str(error):
            raise
        stop = int(ended.group(1)) + 1
        return ShapedOutcome(stop - len(prompt), drafter.low_weight_positions(len(prompt), stop), True, str(error))
    stop = len(prompt) + len(result.tokens)
    return ShapedOutcome(stop - len(prompt), drafter.low_weight_positions(len(prompt), stop), False, "")


@dataclass(frozen=True)
class FuzzPlan:
    """What ``run_soak`` sends."""

    frames: int  # hostile messages, at least, on concurrent streams
    attackers: int = 8  # identities (bearer tokens) they come from
    workers: int = 8  # streams going at once
    deadline_s: float = 30.0  # per stream
    forged: int = 0  # then: streams of forged rejection-mode blocks (``send_forged_stream``)
    shaped: int = 0  # ... shaped-forgery sessions (``run_shaped_forgery``, the strategies in turn)
    generate_calls: int = 0  # ... and hostile Generate requests (``fuzz_generate``)


def run_soak(address: str, factory: HostileFrames, plan: FuzzPlan, *, honest: Callable[[], bool],
             server_pid: int | None = None, sessions_left: Callable[[], int] | None = None,
             progress: Callable[[str], None] = lambda line: None) -> SoakReport:
    """Send what ``plan`` says while ``honest()`` runs generations (True: output as expected; it raises
    ``TableFull``-like ``RuntimeError``s it could not get past) on a thread: first the hostile streams,
    then, the honest edge still decoding, the forgeries and the hostile Generate requests.

    ``server_pid``: the service's process, for RSS and liveness. ``sessions_left``: called after
    everything ended, the sessions the service still holds (after its TTL: leaks).
    """
    report = SoakReport()
    if server_pid:
        report.rss_before_mb = report.rss_peak_mb = process_rss_mb(server_pid)
    stop = threading.Event()
    threads = _watchers(report, honest, server_pid, stop)
    started = time.monotonic()
    endings: Counter = Counter()
    with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        _flood(channel, factory, plan, report, endings, progress)
        if plan.forged or plan.shaped:
            progress(f"{plan.forged} forged streams, {plan.shaped} shaped forgeries")
            _forge(channel, address, factory, report, plan.forged, plan.shaped, plan.deadline_s)
        if plan.generate_calls:
            progress(f"{plan.generate_calls} hostile Generate requests")
            fuzz_generate(channel, factory, report, requests=plan.generate_calls, workers=plan.workers,
                          deadline_s=plan.deadline_s)
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


def _watchers(report: SoakReport, honest: Callable[[], bool], server_pid: int | None,
              stop: threading.Event) -> list[threading.Thread]:
    """Started: the honest edge's loop (at least one session, then until ``stop``; a refusal is timed as
    a lockout and tried again) and, with ``server_pid``, the service's peak RSS."""
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
    return threads


def _flood(channel: grpc.Channel, factory: HostileFrames, plan: FuzzPlan, report: SoakReport, endings: Counter,
           progress: Callable[[str], None]) -> None:
    """At least ``plan.frames`` hostile messages, ``plan.workers`` streams at a time; each ending counted."""

    def collect(done) -> None:
        for future in done:
            _count_ending(report, endings, *future.result())

    with ThreadPoolExecutor(plan.workers) as pool:
        pending: set = set()
        next_progress = 1000
        while report.frames < plan.frames:
            messages, ending = factory.stream()
            report.frames += len(messages)
            report.streams += 1
            owner = f"attacker-{factory.rng.randrange(plan.attackers)}"
            pending.add(pool.submit(send_raw_stream, channel, messages, ending, owner, plan.deadline_s))
            if len(pending) >= plan.workers:  # keep ``workers`` streams going; silent ones hold only their own
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                collect(done)
            if report.frames >= next_progress:
                next_progress += 1000
                progress(f"{report.frames} frames on {report.streams} streams; honest sessions "
                         f"{report.honest_sessions}")
        collect(wait(pending).done)


def _forge(channel: grpc.Channel, address: str, factory: HostileFrames, report: SoakReport, forged: int,
           shaped: int, deadline_s: float) -> None:
    """The forged-draft part of ``run_soak``: its counters go into ``report``."""
    from shared.draft_audit import NOT_SAMPLED

    for _ in range(forged):
        messages, blocks = factory.forged_stream()
        code, details, verdicts = send_forged_stream(channel, messages, blocks, "forger", deadline_s)
        report.forged_streams += 1
        report.forged_blocks += blocks
        report.forged_accepted += verdicts
        report.forged_refused += code == grpc.StatusCode.INVALID_ARGUMENT and NOT_SAMPLED in details
    worst: dict[str, int] = {}
    for i in range(shaped):
        strategy = ("shaped", "tail")[i % 2]
        outcome = run_shaped_forgery(VerifierEndpoint(address, factory.V, factory.fingerprint), factory.prompt,
                                     seed=factory.rng.randrange(2**63), strategy=strategy)
        report.shaped_sessions += 1
        report.shaped_ended += outcome.ended
        count = outcome.positions if strategy == "shaped" else outcome.low_weight
        worst[strategy] = max(worst.get(strategy, 0), count)
    report.shaped_undetected_positions = worst.get("shaped")
    report.shaped_low_weight_positions = worst.get("tail")


def soak_tiny_service(frames: int, *, seed: int = 0, workers: int = 8, session_ttl_s: float = 10.0,
                      progress: Callable[[str], None] = lambda line: None, forged: int = 40,
                      shaped: int = 4, generate_calls: int | None = None) -> SoakReport:
    """``run_soak`` against a real ``splitspec-cloud serve`` process on the tiny generated models,
    with an honest greedy edge (the tiny F32 drafter, D = 4) checked against target-only output,
    ``forged`` forged-draft streams and ``shaped`` shaped forgeries at the end, then ``generate_calls``
    hostile Generate requests (default: one per ten frames).

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
        want = generate(engine, drafter, prompt, greedy, max_new_tokens=40, spec=SpecConfig(0)).tokens
        factory = HostileFrames(engine.vocab_size, engine.fingerprint, prompt, 16, random.Random(seed))
        # (rejection mode granted to all: forged rejection-mode drafts are among what it sends)
        # (no Open rate bound: it opens as fast as it can from one address; the bound has its own test)
        extra = ["--max-draft-len", "16", "--session-ttl", str(session_ttl_s), "--idle-timeout", "2",
                 "--rejection-to", "all", "--opens-per-client", "0"]
        try:
            with CloudProcess(paths["target"], None, extra_args=extra) as cloud:
                address = f"127.0.0.1:{cloud.port}"

                def honest() -> bool:
                    verifier = GrpcVerifier(VerifierEndpoint(address, engine.vocab_size, engine.fingerprint),
                                            verdict_timeout_s=30)
                    return run_decode(drafter, verifier, prompt, greedy, max_new_tokens=40,
                                      spec=SpecConfig(4)).tokens == want

                def sessions_left() -> int:
                    progress(f"waiting {session_ttl_s:.0f}s (the TTL) for parked sessions to expire")
                    time.sleep(session_ttl_s + 1)
                    honest()  # opening a session reaps the expired ones; its end updates the gauge
                    return int(cloud.metric("splitspec_sessions_active"))

                plan = FuzzPlan(frames, workers=workers, forged=forged, shaped=shaped,
                                generate_calls=frames // 10 if generate_calls is None else generate_calls)
                return run_soak(address, factory, plan, honest=honest, server_pid=cloud.proc.pid,
                                sessions_left=sessions_left, progress=progress)
        finally:
            drafter.close()


# -- the unary Generate RPC: one hostile request per call ------------------------------------------------


def hostile_generate_request(factory: HostileFrames) -> bytes:
    """One hostile GenerateRequest, serialized: bytes that are not protobuf at all, a valid request with
    bits flipped, cut or extended, one over gRPC's message limit, or one with ``HostileFrames.random_open``'s
    edge-case fields (the fields Open and GenerateRequest share)."""
    rng = factory.rng
    pick = rng.random()
    if pick < 0.2:
        return rng.randbytes(rng.randrange(1, 64))
    if pick < 0.22:
        return bytes(MAX_MESSAGE_BYTES + 1)
    opened = factory.random_open().open
    request = pb.GenerateRequest(
        vocab_fingerprint=opened.vocab_fingerprint, vocab_size=opened.vocab_size, sampling=opened.sampling,
        prompt=opened.prompt, prompt_compressed=opened.prompt_compressed, max_new_tokens=opened.max_new_tokens,
    )
    return factory.mutated(request) if pick < 0.5 else request.SerializeToString()


def send_raw_generate(channel: grpc.Channel, request: bytes, owner: str, deadline_s: float,
                      abandon: bool = False) -> tuple[grpc.StatusCode, str, bool]:
    """One raw Generate call (``abandon``: cancelled after its first chunk): (final code, details, hung)."""
    call = channel.unary_stream(GENERATE_METHOD, request_serializer=lambda b: b,
                                response_deserializer=pb.GenerateChunk.FromString)(
        request, timeout=deadline_s, metadata=(("authorization", f"Bearer {owner}"),))
    started = time.monotonic()
    try:
        for _ in call:
            if abandon:
                call.cancel()
        return grpc.StatusCode.OK, "", False
    except grpc.RpcError as error:
        hung = error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - started >= deadline_s - 0.1
        return error.code(), error.details() or "", hung


def fuzz_generate(channel: grpc.Channel, factory: HostileFrames, report: SoakReport, *, requests: int,
                  workers: int = 4, deadline_s: float = 30.0, attackers: int = 8) -> None:
    """``requests`` hostile Generate calls (``hostile_generate_request``; one in five abandoned after its
    first chunk), ``workers`` at a time; how each ended goes into ``report`` (an ending outside
    ``ALLOWED_ENDINGS`` into ``report.unexpected``, prefixed "Generate")."""
    endings: Counter = Counter(report.generate_endings)
    with ThreadPoolExecutor(workers) as pool:
        calls = [pool.submit(send_raw_generate, channel, hostile_generate_request(factory),
                             f"attacker-{factory.rng.randrange(attackers)}", deadline_s, factory.rng.random() < 0.2)
                 for _ in range(requests)]
        for future in calls:
            _count_ending(report, endings, *future.result(), what="Generate ")
    report.generate_requests += requests
    report.generate_endings = dict(endings)


def _count_ending(report: SoakReport, endings: Counter, code: grpc.StatusCode, details: str, hung: bool,
                  what: str = "") -> None:
    """How one hostile call ended, into ``endings`` (by code name) and ``report`` (hangs, odd endings)."""
    endings[code.name] += 1
    report.hangs += hung
    if code not in ALLOWED_ENDINGS:
        report.unexpected.append(f"{what}{code.name}: {details}")
