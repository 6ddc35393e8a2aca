"""The wire contract: what both sides of a ``Decode`` stream agree on, in one place.

- Framing sizes: every gRPC message costs its serialized size plus a 5-byte
  prefix (``framed_size``), and rides in at least one HTTP/2 DATA frame with
  a 9-byte header (``http2_framed_size``). The performance model, the fit,
  the benchmarks and both sides' byte counters use these and nothing else.
- The message cap and the channel options, shared by the edge's channel and
  the cloud's server.
- The epoch rule (``next_epoch``), applied by the edge and by the cloud.
- ``server_us`` clamping, and conversions between the schema (``protos``)
  and the domain types, so a field means the same thing on both sides.
- The hints a Decode stream's response headers carry (``StreamHints``), read
  as untrusted.
- Validation of an ``Open``/``GenerateRequest`` body: parsing treats its input
  as untrusted and raises ``ValueError`` with a message fit for an
  ``INVALID_ARGUMENT`` status; the servicer maps it once.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from protos import splitspec_pb2 as pb
from shared import codec
from shared.params import Mode, SamplingParams
from shared.verdict import StopReason, Verdict

__all__ = [
    "GRPC_PREFIX_BYTES",
    "HTTP2_FRAME_HEADER_BYTES",
    "MAX_MESSAGE_BYTES",
    "SLOW_READER_OPTIONS",
    "REPLICA_HEADER",
    "StreamHints",
    "MAX_EARLY_DRAFTS",
    "CHANNEL_OPTIONS",
    "SERVER_OPTIONS",
    "OpenRequest",
    "framed_size",
    "is_loopback",
    "http2_framed_size",
    "message_wire_bytes",
    "next_epoch",
    "committed_skip",
    "server_us",
    "session_id_of",
    "parse_open_request",
    "sampling_to_proto",
    "sampling_from_proto",
    "verdict_to_proto",
    "verdict_from_proto",
    "stop_reason_to_proto",
    "stop_reason_from_proto",
]

GRPC_PREFIX_BYTES = 5  # gRPC length-prefixed message: 1 flag byte + 4 length bytes
HTTP2_FRAME_HEADER_BYTES = 9  # each message rides in (at least) one HTTP/2 DATA frame
# Largest gRPC message either side sends or accepts: a full codec payload plus the frame around it.
MAX_MESSAGE_BYTES = codec.MAX_PAYLOAD_BYTES + (64 << 10)
# A client that reads as little as it can (the benchmarks' slow readers): a 1 KiB receive window, never grown.
SLOW_READER_OPTIONS = (("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0))
_MAX_SERVER_US = 2**32 - 1  # a uint32 field
# Request metadata naming the replica that holds a session (Opened.replica): a resume carries it,
# so a proxy in front of several verifiers can route the stream back to its session.
REPLICA_HEADER = "x-splitspec-replica"
# Response headers a Decode stream is answered with at once, before any frame (``StreamHints``).
TOKEN_TIME_HEADER = "x-splitspec-token-us"
TOKEN_TIME_REPRODUCIBLE_HEADER = "x-splitspec-token-us-reproducible"
BLOCKS_HEADER = "x-splitspec-max-blocks"
_MAX_HINTED_TOKEN_US = 60_000_000  # a minute a token: anything past it is not a hint worth taking
_MAX_HINTED_BLOCKS = 1024


@dataclass(frozen=True)
class StreamHints:
    """What a verifier tells a new Decode stream in its response headers, before the Open: so an
    edge that opens its stream ahead of the prompt (``GrpcVerifier.connect(stream=True)``) can
    choose how a session starts before sending it (``edge.controller.Controller.start``).

    ``token_s``, ``token_s_reproducible``: the verifier's recent seconds per token for a session it
    decodes alone, one that is not reproducible and one that is (their forwards' shapes differ;
    0: not known, as before it has decoded any); ``max_blocks_in_flight``: blocks a session may have
    sent and not had answered (0: not said). Hints only: the Opened's terms still rule."""

    token_s: float = 0.0
    token_s_reproducible: float = 0.0
    max_blocks_in_flight: int = 0

    def token_s_for(self, reproducible: bool) -> float:
        return self.token_s_reproducible if reproducible else self.token_s

    def to_metadata(self) -> tuple[tuple[str, str], ...]:
        said = ((TOKEN_TIME_HEADER, round(self.token_s * 1e6)),
                (TOKEN_TIME_REPRODUCIBLE_HEADER, round(self.token_s_reproducible * 1e6)),
                (BLOCKS_HEADER, self.max_blocks_in_flight))
        return tuple((key, str(value)) for key, value in said if value > 0)

    @classmethod
    def from_metadata(cls, metadata: Sequence[tuple[str, str | bytes]] | None) -> StreamHints:
        """The hints in ``metadata`` (untrusted): a value that is missing, not a decimal integer or out of
        range reads as not said."""
        values = dict(metadata or ())

        def number(key: str, top: int) -> int:
            value = values.get(key)
            if isinstance(value, bytes):
                value = value.decode("ascii", "replace")
            if not isinstance(value, str) or not (value.isascii() and value.isdigit()) or len(value) > 12:
                return 0
            number = int(value)
            return number if 0 < number <= top else 0

        return cls(number(TOKEN_TIME_HEADER, _MAX_HINTED_TOKEN_US) * 1e-6,
                   number(TOKEN_TIME_REPRODUCIBLE_HEADER, _MAX_HINTED_TOKEN_US) * 1e-6,
                   number(BLOCKS_HEADER, _MAX_HINTED_BLOCKS))


# Drafts a block sent before the Opened may hold (Draft.before_opened): the edge cannot know the
# verifier's limit yet; one within this but past the session's limit is dropped, not refused.
MAX_EARLY_DRAFTS = 64  # (the edge sends at most edge.early_block.EARLY_DRAFT_LEN)


def session_id_of(ticket: bytes) -> str:
    """A session's name in logs, the same at both ends: a digest of its resume ticket (which it
    does not reveal), so the name costs the Opened no bytes."""
    return hashlib.blake2b(bytes(ticket), digest_size=8).hexdigest()

CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    # No bandwidth-delay-product probing: its PINGs and their ACKs cost more bytes per
    # round than a draft block on a 50 kbit/s link; our messages are tiny anyway.
    ("grpc.http2.bdp_probe", 0),
    # After a cut the channel reconnects on its own; keep its backoff short so that a link that
    # comes back is used within ~2 s (gRPC's default grows to 120 s).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
)
SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    *CHANNEL_OPTIONS,
    ("grpc.so_reuseport", 0),  # a second server on a taken port must fail, not share it
    ("grpc.http2.max_pings_without_data", 0),  # accept the edges' keepalive pings on idle streams
    ("grpc.keepalive_permit_without_calls", 1),
)

_MODES = {Mode.GREEDY: pb.MODE_GREEDY, Mode.COUPLED: pb.MODE_COUPLED, Mode.REJECTION: pb.MODE_REJECTION}
_MODES_BACK = {v: k for k, v in _MODES.items()}
_STOPS = {StopReason.NONE: pb.STOP_REASON_UNSPECIFIED, StopReason.EOS: pb.STOP_REASON_EOS, StopReason.LENGTH: pb.STOP_REASON_LENGTH}
_STOPS_BACK = {v: k for k, v in _STOPS.items()}


# ---------------------------------------------------------------- framing


def framed_size(message_bytes: int) -> int:
    """Bytes of one gRPC message on the stream: the serialized size plus its 5-byte prefix."""
    return message_bytes + GRPC_PREFIX_BYTES


def http2_framed_size(message_bytes: int) -> int:
    """``framed_size`` plus one 9-byte HTTP/2 DATA frame header (one frame per message)."""
    return framed_size(message_bytes) + HTTP2_FRAME_HEADER_BYTES


def message_wire_bytes(message) -> int:
    """``framed_size`` of a protobuf message: what both sides' byte counters count."""
    return framed_size(message.ByteSize())


def is_loopback(address: str) -> bool:
    """Whether ``address`` (HOST or HOST:PORT) names this machine: localhost, 127.0.0.0/8, ::1.

    A bearer token may cross a connection without TLS only to such an address.
    """
    host = address.strip()
    if host.startswith("["):  # [::1]:port
        host = host[1 : host.find("]")]
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------- session rules


def committed_skip(start_position: int, drafts: Sequence[int], committed: Sequence[int],
                   first_position: int = 0) -> int | None:
    """How many of a block's first drafts the committed tokens already hold, when the block continues
    them: it starts at or before the next position, those drafts are the tokens committed there, and it
    has drafts past them. None: it does not (a verifier answers it stale). ``committed``: the tokens
    from ``first_position`` on (which ``start_position`` is not before)."""
    skip = first_position + len(committed) - start_position
    if skip < 0 or skip >= len(drafts) or list(drafts[:skip]) != list(committed[start_position - first_position :]):
        return None
    return skip


def next_epoch(epoch: int, verdict: Verdict) -> int:
    """The epoch after ``verdict``: one more when it carries a correction (everything
    drafted past it is void, so blocks still in flight at the old epoch are stale);
    unchanged after a bonus, a deferred bonus (``more_follows``) or the end."""
    return epoch + 1 if verdict.is_correction else epoch


def server_us(seconds: float) -> int:
    """Cloud time for a ``server_us`` or ``forward_us`` field: microseconds, clamped to the uint32 range."""
    return min(max(int(seconds * 1e6), 0), _MAX_SERVER_US)


@dataclass(frozen=True)
class OpenRequest:
    """What an ``Open`` or a ``GenerateRequest`` asks for, validated."""

    params: SamplingParams
    prompt: list[int]  # [prompt tokens]
    max_new_tokens: int


def parse_open_request(request, *, vocab_size: int, max_prompt_tokens: int, max_new_tokens: int) -> OpenRequest:
    """Validate the body ``Open`` and ``GenerateRequest`` share (not the vocabulary check).

    Raises ``ValueError`` naming what is wrong: bad sampling, a q̃ support over
    the codec's limit, a malformed, empty or too long prompt, or
    ``max_new_tokens`` outside [1, ``max_new_tokens``].
    """
    params = sampling_from_proto(request.sampling)
    if params.sends_q and params.draft_top_k > codec.MAX_DRAFT_TOP_K:
        raise ValueError(f"draft_top_k {params.draft_top_k} exceeds {codec.MAX_DRAFT_TOP_K}")
    try:
        prompt = codec.decode_tokens(
            request.prompt, request.prompt_compressed, vocab_size, max_tokens=max_prompt_tokens
        ).tolist()
    except ValueError as exc:
        raise ValueError(f"bad prompt: {exc}") from exc
    if not prompt:
        raise ValueError("prompt is empty")
    if not 1 <= request.max_new_tokens <= max_new_tokens:
        raise ValueError(f"max_new_tokens must be in [1, {max_new_tokens}], got {request.max_new_tokens}")
    return OpenRequest(params, prompt, request.max_new_tokens)


# ---------------------------------------------------------------- conversions


def sampling_to_proto(params: SamplingParams) -> pb.Sampling:
    return pb.Sampling(
        mode=_MODES[params.mode],
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        seed=params.seed,
        draft_top_k=params.draft_top_k,
        prob_bits=params.prob_bits,
        reproducible=params.reproducible,
    )


def sampling_from_proto(message: pb.Sampling) -> SamplingParams:
    """Proto3 zeros mean "not set": top_p 0 is 1.0 (off), draft_top_k/prob_bits 0 the defaults."""
    if message.mode not in _MODES_BACK:
        raise ValueError(f"unknown verification mode {message.mode}")
    return SamplingParams(
        mode=_MODES_BACK[message.mode],
        temperature=message.temperature,
        top_k=message.top_k,
        top_p=message.top_p if message.top_p != 0 else 1.0,
        seed=message.seed,
        draft_top_k=message.draft_top_k or SamplingParams.draft_top_k,
        prob_bits=message.prob_bits or SamplingParams.prob_bits,
        reproducible=message.reproducible,
    )


def stop_reason_to_proto(reason: StopReason) -> int:
    return _STOPS[reason]


def stop_reason_from_proto(value: int) -> StopReason:
    if value not in _STOPS_BACK:
        raise ValueError(f"unknown stop reason {value}")
    return _STOPS_BACK[value]


def verdict_to_proto(verdict: Verdict, *, seconds: float = 0.0, forward_s: float = 0.0, forward_rows: int = 0,
                     forwards: int = 0) -> pb.Verdict:
    """``seconds``: cloud time on the block; ``forward_s``: the forward's alone (0: none ran for it);
    ``forward_rows``: the session's rows in it (0: not said); ``forwards``: the session's forwards so far."""
    message = pb.Verdict(
        epoch=verdict.epoch,
        start_position=verdict.start_position,
        accepted=verdict.accepted,
        bonus=verdict.bonus,
        done=verdict.done,
        stop_reason=stop_reason_to_proto(verdict.stop_reason),
        server_us=server_us(seconds),
        forward_us=server_us(forward_s),
        forward_rows=forward_rows,
        forwards=forwards,
        branch=verdict.branch,
        branch_accepted=verdict.branch_accepted,
        stale=verdict.stale,
        rebased=verdict.rebased,
        rebased_verified=verdict.rebased_verified,
        draft_limit=verdict.draft_limit,
        ahead=verdict.ahead,
        unasked=verdict.unasked,
    )
    if verdict.token is not None:
        message.token = verdict.token
    return message


def verdict_from_proto(message: pb.Verdict) -> Verdict:
    return Verdict(
        epoch=message.epoch,
        start_position=message.start_position,
        accepted=message.accepted,
        token=message.token if message.HasField("token") else None,
        bonus=message.bonus,
        done=message.done,
        stop_reason=stop_reason_from_proto(message.stop_reason),
        branch=message.branch,
        branch_accepted=message.branch_accepted,
        stale=message.stale,
        rebased=tuple(message.rebased),
        rebased_verified=message.rebased_verified,
        draft_limit=message.draft_limit,
        ahead=message.ahead,
        unasked=message.unasked,
    )
