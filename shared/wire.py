"""Conversions between the wire schema (``protos``) and the domain types.

Both sides use these, so a field means the same thing on the edge and in the
cloud. Parsing functions treat their input as untrusted and raise
``ValueError`` with a message fit for an ``INVALID_ARGUMENT`` status.
"""

from __future__ import annotations

from protos import splitspec_pb2 as pb
from shared.params import Mode, SamplingParams
from shared.verdict import StopReason, Verdict

__all__ = [
    "sampling_to_proto",
    "sampling_from_proto",
    "verdict_to_proto",
    "verdict_from_proto",
    "stop_reason_to_proto",
    "stop_reason_from_proto",
    "message_wire_bytes",
]

_MODES = {Mode.GREEDY: pb.MODE_GREEDY, Mode.COUPLED: pb.MODE_COUPLED, Mode.REJECTION: pb.MODE_REJECTION}
_MODES_BACK = {v: k for k, v in _MODES.items()}
_STOPS = {StopReason.NONE: pb.STOP_REASON_UNSPECIFIED, StopReason.EOS: pb.STOP_REASON_EOS, StopReason.LENGTH: pb.STOP_REASON_LENGTH}
_STOPS_BACK = {v: k for k, v in _STOPS.items()}
GRPC_PREFIX_BYTES = 5


def message_wire_bytes(message) -> int:
    """Bytes a gRPC message occupies on the stream: payload plus the 5-byte prefix."""
    return message.ByteSize() + GRPC_PREFIX_BYTES


def sampling_to_proto(params: SamplingParams) -> pb.Sampling:
    return pb.Sampling(
        mode=_MODES[params.mode],
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        seed=params.seed,
        draft_top_k=params.draft_top_k,
        prob_bits=params.prob_bits,
    )


def sampling_from_proto(message: pb.Sampling) -> SamplingParams:
    if message.mode not in _MODES_BACK:
        raise ValueError(f"unknown verification mode {message.mode}")
    return SamplingParams(
        mode=_MODES_BACK[message.mode],
        temperature=message.temperature,
        top_k=message.top_k,
        top_p=message.top_p if message.top_p > 0 else 1.0,
        seed=message.seed,
        draft_top_k=message.draft_top_k or SamplingParams.draft_top_k,
        prob_bits=message.prob_bits or SamplingParams.prob_bits,
    )


def stop_reason_to_proto(reason: StopReason) -> int:
    return _STOPS[reason]


def stop_reason_from_proto(value: int) -> StopReason:
    if value not in _STOPS_BACK:
        raise ValueError(f"unknown stop reason {value}")
    return _STOPS_BACK[value]


def verdict_to_proto(verdict: Verdict, server_us: int = 0) -> pb.Verdict:
    message = pb.Verdict(
        epoch=verdict.epoch,
        start_position=verdict.start_position,
        accepted=verdict.accepted,
        bonus=verdict.bonus,
        done=verdict.done,
        stop_reason=stop_reason_to_proto(verdict.stop_reason),
        server_us=min(server_us, 2**32 - 1),
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
    )
