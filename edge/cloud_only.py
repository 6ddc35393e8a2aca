"""The baseline: the cloud decodes every token (``Generate``) and streams each one down.

One call per generation, on a channel of its own; no drafter, no resume (a
broken stream ends it with ``VerifierError``). Measured as the split client
is: framed bytes each way and one ``BlockTiming`` per token.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from edge.channel import BAD_INPUT_CODES, describe_rpc_error, wait_ready
from edge.endpoint import VerifierEndpoint
from edge.report import BlockTiming
from edge.verifier_protocol import VerifierError
from protos import splitspec_pb2 as pb
from protos import splitspec_pb2_grpc as pb_grpc
from shared import codec
from shared.params import SamplingParams
from shared.verdict import StopReason
from shared.wire import message_wire_bytes, sampling_to_proto, stop_reason_from_proto

__all__ = ["CloudOnlyResult", "cloud_only_generate"]


@dataclass
class CloudOnlyResult:
    tokens: list[int]
    stop_reason: StopReason
    wall_s: float
    ttft_s: float
    bytes_up: int
    bytes_down: int
    forwards: int  # target forwards the cloud reported, prefill included
    chunk_log: list[BlockTiming]  # [chunks], one token each
    target_fingerprint: bytes = b""  # the target weights that served it (the first chunk's)


def cloud_only_generate(
    endpoint: VerifierEndpoint,
    prompt: Sequence[int],
    params: SamplingParams,
    *,
    max_new_tokens: int,
    timeout_s: float = 600.0,
    on_tokens=None,
) -> CloudOnlyResult:
    """Up to ``max_new_tokens`` tokens from the cloud alone; ``timeout_s`` bounds the whole call,
    ``on_tokens`` hears each chunk's new tokens."""
    channel = endpoint.open_channel()
    wait_ready(channel, endpoint.address, endpoint.connect_timeout_s)
    vocab_size = endpoint.vocab_size
    encoded = codec.encode_tokens(prompt, vocab_size)
    request = pb.GenerateRequest(
        vocab_fingerprint=endpoint.fingerprint,
        vocab_size=vocab_size,
        sampling=sampling_to_proto(params),
        prompt=encoded.data,
        prompt_compressed=encoded.compressed,
        max_new_tokens=max_new_tokens,
    )
    tokens: list[int] = []
    chunk_log: list[BlockTiming] = []
    bytes_down, ttft, stop, forwards, target = 0, 0.0, StopReason.NONE, 0, None
    started = time.perf_counter()
    try:
        for chunk in pb_grpc.VerifierStub(channel).Generate(request, timeout=timeout_s):
            if target is None:  # (the first chunk says which weights serve it)
                target = chunk.target_fingerprint
                endpoint.check_target(target)
            bytes_down += message_wire_bytes(chunk)
            chunk_log.append(BlockTiming(1, chunk.server_us * 1e-6, 0, message_wire_bytes(chunk)))
            new = codec.decode_tokens(chunk.tokens, chunk.compressed, vocab_size, max_tokens=max_new_tokens).tolist()
            if new and not ttft:
                ttft = time.perf_counter() - started
            tokens.extend(new)
            if on_tokens and new:
                on_tokens(new)
            if chunk.done:  # the total forward count rides on the final chunk only
                stop, forwards = stop_reason_from_proto(chunk.stop_reason), chunk.forwards
                break
    except grpc.RpcError as error:
        raise VerifierError(
            f"cloud-only generation failed: {describe_rpc_error(error)}", error.code() in BAD_INPUT_CODES
        ) from error
    except ValueError as exc:
        raise VerifierError(f"malformed chunk from the cloud: {exc}") from exc
    finally:
        channel.close()
    return CloudOnlyResult(
        tokens, stop, time.perf_counter() - started, ttft, message_wire_bytes(request), bytes_down, forwards, chunk_log,
        target or b"",
    )
