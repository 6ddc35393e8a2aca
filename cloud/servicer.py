"""The gRPC servicer: thin typed RPCs over the handshake, the block stream and the engine.

Every frame is untrusted. Problems with a frame end only its own stream with
``INVALID_ARGUMENT`` (bad payload, wrong position, too long a block, a frame
before Open), ``FAILED_PRECONDITION`` (vocabulary mismatch) or
``RESOURCE_EXHAUSTED`` (session table or KV budget full); other streams never notice.
Torch work runs on the scheduler's engine thread, off the event loop, so a
long forward never stalls the other streams' I/O; the scheduler packs what
every session waits for into shared forwards (``cloud.scheduler``).

Here: the RPCs, the bytes counted in and out, and how a stream ends. The
Open and its session live in ``cloud.handshake``; Draft frames and verdicts
in ``cloud.block_stream``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import replace

import grpc

from cloud.block_stream import BlockStream, read_frame, verdict_message
from cloud.engine import TargetEngine
from cloud.handshake import Handshake
from cloud.identity import Identities
from cloud.limits import ServiceLimits
from cloud.metrics import ServiceMetrics
from cloud.pending_block import MAX_BRANCH_LEN
from cloud.refusals import SlowRefusals
from cloud.scheduler import Scheduler
from cloud.session_table import SessionTable
from cloud.stream_count import StreamCount
from cloud.stream_end import Abort, EndLog, parsed
from protos import splitspec_pb2 as pb
from protos import splitspec_pb2_grpc as pb_grpc
from shared import codec
from shared.wire import message_wire_bytes, server_us, stop_reason_to_proto

log = logging.getLogger(__name__)

__all__ = ["ServiceLimits", "VerifierServicer"]


class VerifierServicer(pb_grpc.VerifierServicer):
    def __init__(
        self, engine: TargetEngine, limits: ServiceLimits, metrics: ServiceMetrics | None = None, *, batching: bool = True,
        identities: Identities | None = None,
    ) -> None:
        """``identities``: who a stream is (``cloud.identity``; default: its peer's host)."""
        cap = getattr(engine, "max_forward_rows", None)
        if cap is not None and limits.max_batch_rows > cap:
            log.info("--max-batch-rows %d lowered to %d: this device keeps a row's bits only at that forward shape",
                     limits.max_batch_rows, cap)
            limits = replace(limits, max_batch_rows=cap)
        block_rows = limits.max_draft_len + 1 + limits.max_branches * min(limits.max_draft_len, MAX_BRANCH_LEN)
        if limits.max_batch_rows < block_rows:  # one block is verified in one forward: it must fit
            raise ValueError(f"max_batch_rows {limits.max_batch_rows} is below one block's rows, {block_rows} "
                             f"(max_draft_len {limits.max_draft_len}, max_branches {limits.max_branches} of up to "
                             f"{MAX_BRANCH_LEN} tokens): raise it, or lower those")
        self.engine = engine
        self.limits = limits
        self.metrics = metrics or ServiceMetrics()
        self.table = SessionTable(limits.max_sessions, limits.session_ttl_s, max_per_owner=limits.max_sessions_per_client,
                                  max_tokens=limits.max_kv_tokens,
                                  keep_slot=(limits.idle_timeout_s, limits.min_tokens_to_keep_slot),
                                  kv_share=(engine.kv_bytes_per_position, limits.max_kv_mib_per_client << 20))
        # One engine thread: sessions' forwards are packed together; torch parallelises inside each.
        self.scheduler = Scheduler(engine, max_rows=limits.max_batch_rows, batching=batching,
                                   min_prefill_rows=min(32, limits.max_batch_rows), on_forward=self.metrics.observe_forward)
        identities = identities or Identities()
        self.handshake = Handshake(engine, limits, self.metrics, self.table, self.scheduler, identities)
        self.blocks = BlockStream(engine, limits, self.metrics, self.table, self.scheduler, identities)
        self._end_log = EndLog()
        self.streams = StreamCount(limits.max_streams_per_client)
        self.refusals = SlowRefusals(limits.refusal_delay_s)  # (the server's token check holds its refusals too)

    @property
    def replica(self) -> str:
        """This replica's name, told to edges in Opened (their key to its MQTT load)."""
        return self.handshake.replica

    @replica.setter
    def replica(self, name: str) -> None:
        self.handshake.replica = name

    @property
    def max_branches(self) -> int:
        """Hedge branches a block may carry here (none where the engine cannot verify a tree)."""
        return self.handshake.max_branches

    @property
    def engine_queue(self) -> int:
        """Engine jobs submitted and not finished (the running ones included)."""
        return self.scheduler.pending

    @property
    def recent_overheads_s(self) -> deque[float]:
        """The latest per-verify service times outside the forward, seconds (for benchmarks and debugging)."""
        return self.blocks.recent_overheads_s

    @property
    def recent_latencies_s(self) -> deque[float]:
        """The latest block arrival -> verdict times, seconds, one per chain."""
        return self.blocks.recent_latencies_s

    def _count_in(self, message) -> None:
        self.metrics.bytes_in.inc(message_wire_bytes(message))

    async def _write(self, context, message) -> None:
        """Send ``message`` down the stream. A write the edge does not take within ``write_timeout_s`` (its
        HTTP/2 window is full: it stopped reading) ends the stream: its session is parked (a Decode's,
        resumable by its ticket) or ended (a Generate's), and its slot goes to the next client."""
        self.metrics.bytes_out.inc(message_wire_bytes(message))
        timeout_s = self.limits.write_timeout_s
        write = asyncio.ensure_future(context.write(message))
        done, _ = await asyncio.wait({write}, timeout=timeout_s)
        if not done:  # (not wait_for: it would wait for the stuck write to take its cancellation)
            write.cancel()
            raise Abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"the edge took no message for {timeout_s:g} s (it stopped reading)",
                        park=True)
        write.result()

    # -- RPCs --------------------------------------------------------------
    async def _admitted(self, context) -> str:
        """The stream's identity, counted among its streams; at its limit the stream is refused with
        ``RESOURCE_EXHAUSTED`` (``context.abort`` raises) before it reads or holds anything."""
        identity = self.handshake.owner(context)
        if self.streams.enter(identity):
            return identity
        self.metrics.sessions_failed.labels(code=grpc.StatusCode.RESOURCE_EXHAUSTED.name).inc()
        await self.refusals.hold(grpc.StatusCode.RESOURCE_EXHAUSTED)
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"this client already has {self.streams.limit} streams open, the limit per client; "
                            "close one first")
        raise AssertionError("unreachable: context.abort raises")

    async def Decode(self, request_iterator, context):
        """Split decoding: an Open, then Draft frames up and one verdict per block down."""
        identity = await self._admitted(context)
        try:
            await self._decode(context)
        finally:
            self.streams.leave(identity)

    async def Generate(self, request, context):
        """Cloud-only decoding: the target generates every token and streams it down. The first
        chunk's ``server_us`` counts from the request (prefill included), as the first verdict's
        does from the Open."""
        identity = await self._admitted(context)
        try:
            await self._generate(request, context)
        finally:
            self.streams.leave(identity)

    async def _decode(self, context) -> None:
        entry, failure = None, None
        stream = 0  # the session's stream number while this stream drives it
        finished = False
        try:
            # Answer the headers now: an edge may open its stream ahead of the prompt
            # (``GrpcVerifier.connect(stream=True)``); the Opened then travels without them, and the edge
            # times the round trip and reads the hints before its Open.
            await context.send_initial_metadata(self.blocks.hints().to_metadata())
            first = await read_frame(context, self.limits.open_timeout_s)
            if first is grpc.aio.EOF:
                return
            self._count_in(first)
            if first.WhichOneof("kind") != "open":
                raise Abort(grpc.StatusCode.INVALID_ARGUMENT, f"the first frame must be Open, got {first.WhichOneof('kind') or 'an empty frame'}")
            opened_at = time.perf_counter()  # the first verdict's cloud time counts from the Open (prefill included)
            entry, stream, opened, answer_first = await self.handshake.attach(first.open, context)
            session = entry.session
            if answer_first:  # the first position, answered from the prefill's last row, rides with the Opened
                first_answer = await self.blocks.decode_alone(entry, opened_at, stream)
                opened.first_verdict.CopyFrom(verdict_message(first_answer, session.forwards))
            opened.MergeFrom(self.handshake.service_fields(entry))
            await self._write(context, pb.CloudFrame(opened=opened))
            if session.done and not answer_first:  # resumed after its final verdict was lost: the Opened told the rest
                finished = True
                return
            frames = self.blocks.frame_queue()
            ending: list = []  # block_stream.CLOSE or EOF once the edge ends the stream
            reader = asyncio.create_task(self.blocks.read_frames(context, frames))
            try:
                if not session.done:  # (the first verdict may have been the last)
                    async for answer in self.blocks.verdicts(entry, stream, frames, ending):
                        await self._write(context, pb.CloudFrame(verdict=verdict_message(answer, session.forwards)))
                        if answer.verdict.done:
                            break
                finished = await self.blocks.finished(session, frames, ending)
            finally:
                reader.cancel()
        except Abort as exc:
            finished, failure = not exc.park, exc
            self.metrics.sessions_failed.labels(code=exc.code.name).inc()
            self._end_log.ended(entry, exc)
        finally:
            if entry is not None and entry.stream == stream:  # else a newer stream drives the session now
                self.handshake.release(entry, finished)
        if failure is not None:  # (after the release: a stream that stopped reading may hold the abort too)
            if entry is None:  # refused at its Open
                await self.refusals.hold(failure.code)
            await context.abort(failure.code, str(failure))

    async def _generate(self, request, context) -> None:
        entry, failure = None, None
        try:
            self._count_in(parsed(request, "request"))
            arrived = time.perf_counter()
            handshake = self.handshake
            asked = handshake.parse_request(request)
            handshake.check_mode(asked.params, context)  # the modes this verifier serves, as for an Open
            entry = await handshake.new_session(asked, 0, handshake.owner(context))
            session, first_sent = entry.session, False
            while not session.done:
                answer = await self.blocks.decode_alone(entry, arrived, entry.stream)
                verdict, seconds = answer.verdict, answer.seconds
                encoded = codec.encode_tokens([verdict.token] if verdict.token is not None else [], self.engine.vocab_size)
                await self._write(
                    context,
                    pb.GenerateChunk(
                        tokens=encoded.data,
                        compressed=encoded.compressed,
                        done=verdict.done,
                        stop_reason=stop_reason_to_proto(verdict.stop_reason),
                        server_us=server_us(seconds),
                        forwards=session.forwards if verdict.done else 0,
                        target_fingerprint=b"" if first_sent else self.engine.weights_fingerprint,
                    ),
                )
                arrived, first_sent = time.perf_counter(), True
        except Abort as exc:
            failure = exc
            self.metrics.sessions_failed.labels(code=exc.code.name).inc()
            self._end_log.ended(entry, exc)
        finally:
            self.handshake.release(entry, True)
        if failure is not None:  # (after the release, as for Decode)
            if entry is None:  # refused before it started
                await self.refusals.hold(failure.code)
            await context.abort(failure.code, str(failure))
