"""Slow readers: a stream that stops reading its verdicts or tokens cannot hold a session slot.

A client that stops reading fills its HTTP/2 window, and the verifier's next write waits for it. Each
write waits ``write_timeout_s`` at most: then a Decode stream's session is parked (resumable by its
ticket, as after a cut) and a Generate's is ended, so the slot goes to the next client. The clients
here read one message, then nothing, over a channel whose receive window is 1 KiB, so the window
fills within a few dozen messages.
"""

from __future__ import annotations

import time

import grpc
from helpers import GENERATE, generate_request, tiny_prompt

from cloud.limits import ServiceLimits
from protos import splitspec_pb2 as pb
from shared import codec
from shared.params import Mode, SamplingParams
from shared.wire import sampling_to_proto

SMALL_WINDOW = (("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0))


def stop_reading_generate(address: str, request: bytes):
    """A Generate call that reads its first chunk and then nothing: (its channel, the call)."""
    channel = grpc.insecure_channel(address, options=SMALL_WINDOW)
    call = channel.unary_stream(GENERATE, request_serializer=lambda b: b,
                                response_deserializer=pb.GenerateChunk.FromString)(request, timeout=120)
    next(call)
    return channel, call


def wait_until(predicate, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


def test_generate_calls_that_stop_reading_lose_their_slots(tiny_engine, serve):
    limits = ServiceLimits(max_sessions=2, max_sessions_per_client=2, write_timeout_s=1.0)
    server = serve(limits)
    table = server.server.servicer.table
    prompt = tiny_prompt(tiny_engine, "The cat sat")
    request = generate_request(tiny_engine, prompt, 2000)
    stalled = [stop_reading_generate(server.address, request) for _ in range(2)]
    try:
        assert wait_until(lambda: len(table) == 0, within_s=20), f"{len(table)} sessions still held"
        with grpc.insecure_channel(server.address) as channel:  # an honest client is served
            call = channel.unary_stream(GENERATE, request_serializer=lambda b: b,
                                        response_deserializer=pb.GenerateChunk.FromString)
            chunks = list(call(generate_request(tiny_engine, prompt, 8), timeout=30))
        assert chunks[-1].done
    finally:
        for channel, call in stalled:
            call.cancel()
            channel.close()


DECODE = "/splitspec.v1.Verifier/Decode"
JUNK_FRAMES, JUNK_BYTES = 60, 100_000


def open_frame(engine, prompt) -> pb.EdgeFrame:
    encoded = codec.encode_tokens(prompt, engine.vocab_size)
    return pb.EdgeFrame(open=pb.Open(vocab_size=engine.vocab_size, vocab_fingerprint=engine.fingerprint,
                                     sampling=sampling_to_proto(SamplingParams(mode=Mode.GREEDY)),
                                     prompt=encoded.data, max_new_tokens=1500))


def stop_reading_decode(address: str, engine, prompt):
    """A Decode stream that reads its Opened and then nothing, while it sends empty blocks (each answered
    by a verdict: they fill its window) and then ``JUNK_FRAMES`` frames of ``JUNK_BYTES`` as fast as
    the verifier takes them: (its channel, the call)."""

    def frames():
        yield open_frame(engine, prompt).SerializeToString()
        for _ in range(100):
            time.sleep(0.015)  # (paced: never more blocks in flight than the verifier allows)
            yield pb.EdgeFrame(draft=pb.Draft(epoch=0, start_position=len(prompt) + 1)).SerializeToString()
        junk = pb.EdgeFrame(draft=pb.Draft(epoch=0, start_position=len(prompt) + 1, payload=b"\x01" * JUNK_BYTES))
        for _ in range(JUNK_FRAMES):
            yield junk.SerializeToString()

    channel = grpc.insecure_channel(address, options=SMALL_WINDOW)
    call = channel.stream_stream(DECODE, request_serializer=lambda b: b,
                                 response_deserializer=pb.CloudFrame.FromString)(frames(), timeout=120)
    assert next(call).WhichOneof("kind") == "opened"
    return channel, call


def test_a_decode_stream_that_stops_reading_is_parked_and_reads_no_more_than_its_queue(tiny_engine, serve, caplog):
    """The session of a Decode stream that stops reading is parked after ``write_timeout_s`` (so the table
    may evict it for another client), and while its verdict loop waits on the write, the verifier reads
    at most a bounded queue of its frames: not the megabytes it keeps sending."""
    limits = ServiceLimits(max_sessions=1, max_blocks_in_flight=4, write_timeout_s=2.0, session_ttl_s=60)
    server = serve(limits)
    table, metrics = server.server.servicer.table, server.server.servicer.metrics.registry
    prompt = tiny_prompt(tiny_engine, "The cat sat")
    channel, call = stop_reading_decode(server.address, tiny_engine, prompt)
    try:
        assert wait_until(lambda: table.parked == 1, within_s=20), "the session is still attached"
        time.sleep(0.5)  # (the stream's reader is gone with it: nothing more is read)
        read = metrics.get_sample_value("splitspec_bytes_in_total")
        assert read < 12 * JUNK_BYTES, f"read {read:.0f} bytes of the {JUNK_FRAMES * JUNK_BYTES} sent"
        with grpc.insecure_channel(server.address) as honest:  # the parked session makes room for the next
            stream = honest.stream_stream(DECODE, request_serializer=lambda b: b,
                                          response_deserializer=pb.CloudFrame.FromString)
            replies = stream(iter([open_frame(tiny_engine, prompt).SerializeToString()]), timeout=30)
            assert next(replies).WhichOneof("kind") == "opened"
            replies.cancel()
        assert "Traceback" not in caplog.text
    finally:
        call.cancel()
        channel.close()
