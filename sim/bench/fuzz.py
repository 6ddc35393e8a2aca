"""Hostile traffic for the verifier: frame generators, and the soak run of ``splitspec bench fuzz``.

``HostileFrames`` makes what an attacker or a broken client sends on a
``Decode`` stream: valid Opens with fields set to edge-case values, drafts
with random payloads, ids, positions and epochs, zstd bombs, payloads over
the codec's limit, messages over gRPC's limit, bytes that are not protobuf at
all, and valid frames with bits flipped; and forged rejection-mode drafts:
well-formed blocks whose tokens were not sampled from their q̃, garbage at the
largest D, and (``ForgingDrafter``) q̃ shaped around the noise the forger
knows, so its token is the draw at a tiny weight. ``run_soak`` sends at least a given
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
import numpy as np
from google.protobuf.message import DecodeError

from edge.drafter import DraftBlock, ModelFreeDrafter
from protos import splitspec_pb2 as pb
from shared import codec
from shared.sparse import SparseDist, draft_noise, quantize, sampled_indices
from shared.wire import CHANNEL_OPTIONS, MAX_MESSAGE_BYTES, sampling_to_proto
from sim.experiment.processes import process_rss_mb

__all__ = [
    "HostileFrames", "SoakReport", "run_soak", "send_raw_stream", "DECODE_METHOD", "ALLOWED_ENDINGS",
    "ForgingDrafter", "shaped_q", "neutral_q", "send_forged_stream", "run_shaped_forgery", "ShapedOutcome",
    "GENERATE_METHOD", "hostile_generate_request", "send_raw_generate", "fuzz_generate",
]

DECODE_METHOD = "/splitspec.v1.Verifier/Decode"
GENERATE_METHOD = "/splitspec.v1.Verifier/Generate"
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


# -- forged drafts: rejection-mode blocks whose tokens were not sampled from their q̃ -------------------


def shaped_q(want: int, r: int, prob_bits: int, top_k: int, others: list[int]) -> SparseDist:
    """A q̃ shaped around the known DRAFT noise ``r``: ``want`` is what the drafter's sampling rule draws
    (``shared.sparse.sampled_indices``), at the smallest weight a valid wire q̃ allows (weights
    non-increasing, support <= ``top_k``), the rest spread on ``others`` (distinct ids, ``want`` not
    among them, at least ``top_k - 1``) as flat as it goes, so the q̃ looks as likely as it can.

    The sample is the token whose cumulative interval holds r; weights fall along the support, so
    ``want`` at weight w either follows heavier tokens that fill [0, r) (w >= (2^b - r)/(top_k - 1)
    for the rest to fit behind it) or comes first (w > r, w >= 2^b/top_k).
    """
    total = 1 << prob_bits
    if top_k == 1:
        return SparseDist(np.array([want]), np.array([total]), prob_bits)
    after = -(-(total - r) // (top_k - 1))  # want at [r, r + w): heavier tokens before it fill [0, r)
    first = max(r + 1, -(-total // top_k))  # want at [0, w)
    weight, start = (after, r) if 1 <= after <= r and after < first else (first, 0)
    tail = total - start - weight
    least_tail = -(-tail // weight)  # tokens behind want, each <= w
    heads = min(start // weight, top_k - 1 - least_tail) if start else 0
    tails = min(tail, top_k - 1 - heads)
    head_weights = _split(start, heads)
    tail_weights = _split(tail, tails)
    support = [*others[:heads], want, *others[heads : heads + tails]]
    return SparseDist(np.array(support), np.array([*head_weights, weight, *tail_weights]), prob_bits)


def neutral_q(want: int, r: int, prob_bits: int, top_k: int, others: list[int]) -> SparseDist | None:
    """A uniform q̃ over ``top_k`` tokens with ``want`` where ``r`` falls (a forgery no test on q̃ alone
    can see: the draw is exactly as likely as an honest one); None when ``top_k`` does not divide 2^b."""
    total = 1 << prob_bits
    if total % top_k:
        return None
    support = list(others[: top_k - 1])
    support.insert(r // (total // top_k), want)
    return SparseDist(np.array(support), np.full(top_k, total // top_k), prob_bits)


def _split(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` near-equal positive integers, largest first."""
    if not parts:
        return []
    base, extra = divmod(total, parts)
    return [base + 1] * extra + [base] * (parts - extra)


class ForgingDrafter(ModelFreeDrafter):
    """A hostile rejection-mode edge behind the ``Drafter`` lifecycle: at every position it drafts
    ``want(position)`` with a q̃ shaped around the session's DRAFT noise (it knows the seed).

    ``strategy``: ``"shaped"`` gives the token the smallest weight the wire allows at each position
    (``shaped_q``); ``"tail"`` gives it weight <= 2^-8 where the wire allows that and a uniform q̃
    (``neutral_q``) elsewhere. ``weights[position]``: the weight (a fraction) it last drafted there.
    """

    def __init__(self, vocab_size: int, want, strategy: str = "shaped", seed: int = 0) -> None:
        if strategy not in ("shaped", "tail"):
            raise ValueError(f"unknown forging strategy {strategy!r}")
        super().__init__(vocab_size)
        self.want, self.strategy = want, strategy
        self.rng = random.Random(seed)
        self.weights: dict[int, float] = {}

    def propose_block(self, n: int) -> DraftBlock:
        params = self._params
        start = len(self._spec.tokens)
        tokens, q = [], []
        for position in range(start, start + n):
            want = int(self.want(position))
            others = self.rng.sample([t for t in range(self.vocab_size) if t != want], params.draft_top_k)
            r = int(draft_noise(params.seed, position, params.prob_bits))
            dist = shaped_q(want, r, params.prob_bits, params.draft_top_k, others)
            if self.strategy == "tail" and dist.prob(want) > 2.0**-8:
                dist = neutral_q(want, r, params.prob_bits, params.draft_top_k, others) or dist
            tokens.append(want)
            q.append(dist)
            self.weights[position] = dist.prob(want)
        return DraftBlock(tokens, q)

    def low_weight_positions(self, start: int, stop: int) -> int:
        """Positions in [start, stop) where it drafted its token at weight <= 2^-8."""
        return sum(1 for position, w in self.weights.items() if start <= position < stop and w <= 2.0**-8)


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

    def rejection_open(self, seed: int, *, draft_top_k: int = 16, prob_bits: int = 8) -> pb.EdgeFrame:
        """A valid rejection-mode Open (temperature 1) with ``seed``: the noise a forger knows."""
        from shared.params import Mode, SamplingParams

        params = SamplingParams(mode=Mode.REJECTION, temperature=1.0, seed=seed, draft_top_k=draft_top_k,
                                prob_bits=prob_bits)
        return self.valid_open(sampling=sampling_to_proto(params))

    def forged_draft(self, start: int, seed: int, n: int, *, garbage: bool = False, draft_top_k: int = 16,
                     prob_bits: int = 8) -> pb.EdgeFrame:
        """A well-formed rejection-mode block of ``n`` drafts from ``start`` whose tokens were not sampled
        from their q̃: honest-looking q̃ (a quantized random distribution) with another token of the
        support than the one the DRAFT noise draws (``garbage``: random tokens of the support, at
        least one of them not the draw)."""
        rng = self.rng
        q = []
        for _ in range(n):
            ids = np.array(rng.sample(range(self.V), min(self.V, draft_top_k)))
            q.append(quantize(np.random.default_rng(rng.randrange(2**32)).dirichlet(np.ones(ids.size)), draft_top_k,
                              prob_bits, ids=ids))
        drawn = [int(dist.support[i]) for dist, i in zip(q, sampled_indices(q, seed, start))]
        forged = set(range(n)) if not garbage else {rng.randrange(n)}
        tokens = []
        for i, (dist, token) in enumerate(zip(q, drawn)):
            choices = [int(t) for t in dist.support if int(t) != token] or [token]
            tokens.append(rng.choice(choices) if i in forged else int(rng.choice(dist.support.tolist())))
        encoded = codec.encode_draft(tokens, self.V, q, draft_top_k=draft_top_k)
        return pb.EdgeFrame(draft=pb.Draft(epoch=0, start_position=start, payload=encoded.data,
                                           compressed=encoded.compressed))

    def forged_stream(self) -> tuple[list[bytes], int]:
        """A rejection-mode Open, then one to three forged blocks chained from the first position (naive
        forgeries, or garbage at the largest D): (messages, blocks)."""
        rng = self.rng
        seed = rng.randrange(2**63)
        messages = [self.rejection_open(seed).SerializeToString()]
        start, blocks = self.P, rng.randrange(1, 4)
        for _ in range(blocks):
            garbage = rng.random() < 0.5
            n = self.max_draft_len if garbage else rng.randrange(1, self.max_draft_len + 1)
            frame = self.forged_draft(start, seed, n, garbage=garbage)
            frame.draft.more_follows = True
            messages.append(frame.SerializeToString())
            start += n
        return messages, blocks

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
    # Forged rejection-mode drafts (``HostileFrames.forged_stream``, ``run_shaped_forgery``):
    forged_streams: int = 0
    forged_blocks: int = 0
    forged_accepted: int = 0  # naive forged blocks answered with a verdict, not refused (must be 0)
    forged_refused: int = 0  # streams ended INVALID_ARGUMENT "draft not sampled from its q̃"
    shaped_sessions: int = 0
    shaped_ended: int = 0  # ... ended by the draft audit (others finished first: EOS, or their length)
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


def run_shaped_forgery(address: str, vocab_size: int, fingerprint: bytes, prompt: list[int], *, seed: int,
                       strategy: str = "shaped", draft_top_k: int = 16, max_new_tokens: int = 400,
                       draft_len: int = 4) -> ShapedOutcome:
    """A rejection-mode session driven by a ``ForgingDrafter`` (``strategy``) through the real edge
    loop, until the service ends it or it finishes."""
    from edge.decode_loop import run_decode
    from edge.endpoint import VerifierEndpoint
    from edge.grpc_verifier import GrpcVerifier
    from edge.verifier_protocol import VerifierError
    from shared.params import Mode, SamplingParams

    params = SamplingParams(mode=Mode.REJECTION, temperature=1.0, seed=seed, draft_top_k=draft_top_k, prob_bits=8)
    # The token it wants at each position: an id away from the special ones (an EOS would end it first).
    drafter = ForgingDrafter(vocab_size, lambda position: 3 + (position * 7919 + seed) % (vocab_size - 3),
                             strategy, seed)
    verifier = GrpcVerifier(VerifierEndpoint(address, vocab_size, fingerprint), verdict_timeout_s=30,
                            outage_budget_s=0)
    try:
        result = run_decode(drafter, verifier, prompt, params, max_new_tokens=max_new_tokens, draft_len=draft_len)
    except VerifierError as error:
        ended = re.search(r"position (\d+)", str(error))  # the audit names the position it stopped at
        if ended is None or "INVALID_ARGUMENT" not in str(error):
            raise
        stop = int(ended.group(1)) + 1
        return ShapedOutcome(stop - len(prompt), drafter.low_weight_positions(len(prompt), stop), True, str(error))
    stop = len(prompt) + len(result.tokens)
    return ShapedOutcome(stop - len(prompt), drafter.low_weight_positions(len(prompt), stop), False, "")


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
    forged: int = 0,
    shaped: int = 0,
    generate_calls: int = 0,
) -> SoakReport:
    """Send at least ``frames`` hostile messages on concurrent streams from ``attackers`` identities
    (bearer tokens), while ``honest()`` runs generations (True: output as expected; it raises
    ``TableFull``-like ``RuntimeError``s it could not get past) on a thread.

    Then, the honest edge still decoding, ``forged`` streams of forged rejection-mode blocks
    (``send_forged_stream``) and ``shaped`` shaped-forgery sessions (``run_shaped_forgery``, the
    strategies in turn), and ``generate_calls`` hostile Generate requests (``fuzz_generate``).

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
            _count_ending(report, endings, *future.result())

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
        if forged or shaped:
            progress(f"{forged} forged streams, {shaped} shaped forgeries")
            _forge(channel, address, factory, report, forged, shaped, deadline_s)
        if generate_calls:
            progress(f"{generate_calls} hostile Generate requests")
            fuzz_generate(channel, factory, report, requests=generate_calls, workers=workers, deadline_s=deadline_s)
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
        outcome = run_shaped_forgery(address, factory.V, factory.fingerprint, factory.prompt,
                                     seed=factory.rng.randrange(2**63), strategy=strategy)
        report.shaped_sessions += 1
        report.shaped_ended += outcome.ended
        if outcome.ended:
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
                                sessions_left=sessions_left, workers=workers, progress=progress, forged=forged,
                                shaped=shaped, generate_calls=frames // 10 if generate_calls is None else generate_calls)
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
