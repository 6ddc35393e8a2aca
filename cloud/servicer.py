"""The gRPC servicer: a thin shell over sessions and the engine.

Every frame is untrusted. Problems with a frame end only its own stream with
``INVALID_ARGUMENT`` (bad payload, wrong position, too long a block, a frame
before Open), ``FAILED_PRECONDITION`` (vocabulary mismatch) or
``RESOURCE_EXHAUSTED`` (session table full); other streams never notice.
Torch work runs on one worker thread, off the event loop, so a long forward
never stalls the other streams' I/O.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import grpc

from cloud.engine import TargetEngine
from cloud.limits import ServiceLimits
from cloud.metrics import ServiceMetrics
from cloud.session import BlockRejected, VerifierSession
from cloud.session_table import SessionEntry, SessionTable, TableFull
from protos import splitspec_pb2 as pb
from protos import splitspec_pb2_grpc as pb_grpc
from shared import codec
from shared.stats import RoundRecord
from shared.verdict import Verdict
from shared.vocab import describe_vocab
from shared.wire import (
    OpenRequest,
    message_wire_bytes,
    parse_open_request,
    server_us,
    stop_reason_to_proto,
    verdict_to_proto,
)

__all__ = ["ServiceLimits", "VerifierServicer"]

log = logging.getLogger(__name__)


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class VerifierServicer(pb_grpc.VerifierServicer):
    def __init__(self, engine: TargetEngine, limits: ServiceLimits, metrics: ServiceMetrics | None = None) -> None:
        self.engine = engine
        self.limits = limits
        self.metrics = metrics or ServiceMetrics()
        self.table = SessionTable(limits.max_sessions, limits.session_ttl_s)
        # The latest per-verify service times outside the forward, seconds (for benchmarks and debugging).
        self.recent_overheads_s: deque[float] = deque(maxlen=10_000)
        # One thread: forwards are serialised; torch parallelises inside each.
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="target")

    # -- helpers -----------------------------------------------------------
    async def _in_engine(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def _count_in(self, message) -> None:
        self.metrics.bytes_in.inc(message_wire_bytes(message))

    def _count_out(self, message):
        self.metrics.bytes_out.inc(message_wire_bytes(message))
        return message

    def _check_vocab(self, vocab_size: int, fingerprint: bytes) -> None:
        engine = self.engine
        if vocab_size != engine.vocab_size or bytes(fingerprint) != engine.fingerprint:
            raise _Abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "vocabulary mismatch: "
                + describe_vocab("the edge drafter", vocab_size, bytes(fingerprint))
                + " vs "
                + describe_vocab(f"the cloud target {engine.model_name}", engine.vocab_size, engine.fingerprint),
            )

    def _parse_request(self, request) -> OpenRequest:
        """Validate what Open and GenerateRequest share (``shared.wire``) and the vocabulary."""
        self._check_vocab(request.vocab_size, request.vocab_fingerprint)
        try:
            return parse_open_request(
                request,
                vocab_size=self.engine.vocab_size,
                max_prompt_tokens=self.limits.max_prompt_tokens,
                max_new_tokens=self.limits.max_new_tokens,
            )
        except ValueError as exc:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc

    async def _new_session(self, opened: OpenRequest, max_draft_len: int) -> SessionEntry:
        params, prompt, max_new_tokens = opened.params, opened.prompt, opened.max_new_tokens
        try:
            self.table.reserve()  # refuse before spending a prefill on a session that cannot be kept
            session = await self._in_engine(
                lambda: VerifierSession(
                    self.engine, prompt, params, max_new_tokens=max_new_tokens, max_draft_len=max_draft_len
                )
            )
            entry = self.table.add(session)  # checks again: others may have opened during the prefill
        except TableFull as exc:
            raise _Abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)) from exc
        self.metrics.sessions_opened.inc()
        self.metrics.sessions_active.set(len(self.table))
        self.metrics.observe_open(forwards=session.forwards)
        return entry

    def _end(self, entry: SessionEntry | None, finished: bool) -> None:
        if entry is None:
            return
        if finished:
            self.table.remove(entry)
        else:
            self.table.detach(entry)
        self.metrics.sessions_active.set(len(self.table))

    async def _read(self, context, timeout: float):
        try:
            return await asyncio.wait_for(context.read(), timeout)
        except TimeoutError as exc:
            raise _Abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"no frame from the edge for {timeout:.0f}s") from exc

    async def _verify(self, entry: SessionEntry, draft: pb.Draft) -> tuple[Verdict | None, int]:
        """Decode and verify one block; None for a stale block (an older epoch), which is dropped."""
        session = entry.session
        received = time.perf_counter()
        if draft.epoch < session.epoch:
            log.debug("session %s: dropped stale block of epoch %d", entry.session_id, draft.epoch)
            return None, 0
        if draft.epoch > session.epoch:
            raise _Abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"block epoch {draft.epoch} is ahead of the session's epoch {session.epoch}",
            )
        params = session.params
        try:
            tokens, q = codec.decode_draft(
                draft.payload,
                draft.compressed,
                self.engine.vocab_size,
                max_tokens=session.max_draft_len,
                draft_top_k=params.draft_top_k if params.sends_q else None,
                prob_bits=params.prob_bits if params.sends_q else None,
            )
        except ValueError as exc:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad draft block: {exc}") from exc
        return await self._run_verify(entry, draft.epoch, draft.start_position, tokens.tolist(), q, received)

    async def _run_verify(self, entry: SessionEntry, epoch, start_position, tokens, q, received: float):
        """One verify on the engine thread, observed once; returns (verdict, cloud seconds)."""
        session = entry.session
        forward_before, forwards_before = session.seq.forward_s, session.forwards
        try:
            verdict = await self._in_engine(session.verify, epoch, start_position, tokens, q)
        except BlockRejected as exc:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        elapsed = time.perf_counter() - received
        self.table.touch(entry)
        overhead = max(elapsed - (session.seq.forward_s - forward_before), 0.0)
        self.recent_overheads_s.append(overhead)
        self.metrics.observe_round(
            RoundRecord(
                drafted=len(tokens),
                accepted=verdict.accepted,
                committed=len(verdict.committed(tokens)),
                forwards=session.forwards - forwards_before,
            ),
            latency_s=elapsed,
            overhead_s=overhead,
        )
        return verdict, elapsed

    # -- RPCs --------------------------------------------------------------
    async def Decode(self, request_iterator, context):
        entry = None
        finished = False
        try:
            first = await self._read(context, self.limits.open_timeout_s)
            if first is grpc.aio.EOF:
                return
            self._count_in(first)
            if first.WhichOneof("kind") != "open":
                raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"the first frame must be Open, got {first.WhichOneof('kind') or 'an empty frame'}")
            entry = await self._open(first.open)
            session = entry.session
            yield self._count_out(
                pb.CloudFrame(
                    opened=pb.Opened(
                        session_id=entry.session_id,
                        resume_ticket=entry.ticket,
                        vocab_size=self.engine.vocab_size,
                        committed_length=len(session.tokens),
                        max_draft_len=session.max_draft_len,
                        forwards=session.forwards,
                    )
                )
            )
            while True:
                frame = await self._read(context, self.limits.session_ttl_s)
                if frame is grpc.aio.EOF:
                    break
                self._count_in(frame)
                kind = frame.WhichOneof("kind")
                if kind == "close":
                    finished = True
                    break
                if kind != "draft":
                    raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"unexpected {kind or 'empty'} frame in an open session")
                verdict, seconds = await self._verify(entry, frame.draft)
                if verdict is None:
                    continue
                # The forward count rides on the final verdict only: 0 is not sent, so rounds pay no bytes for it.
                message = verdict_to_proto(verdict, seconds=seconds, forwards=session.forwards if verdict.done else 0)
                yield self._count_out(pb.CloudFrame(verdict=message))
                if verdict.done:
                    finished = True
                    break
        except _Abort as exc:
            finished = True
            self.metrics.sessions_failed.labels(code=exc.code.name).inc()
            log.info("session %s ended: %s: %s", entry.session_id if entry else "-", exc.code.name, exc)
            await context.abort(exc.code, str(exc))
        finally:
            self._end(entry, finished)

    async def _open(self, request: pb.Open) -> SessionEntry:
        if request.resume_ticket:
            entry = self.table.resume(request.resume_ticket)
            if entry is None:
                raise _Abort(grpc.StatusCode.NOT_FOUND, "no resumable session for that ticket; reopen with the committed tokens as the prompt")
            return entry
        opened = self._parse_request(request)
        max_draft_len = min(request.max_draft_len or self.limits.max_draft_len, self.limits.max_draft_len)
        entry = await self._new_session(opened, max_draft_len)
        params = opened.params
        log.info(
            "session %s opened: %d prompt tokens, mode %s, T=%.2f, D<=%d, max %d new",
            entry.session_id, len(opened.prompt), params.mode.value, params.temperature, max_draft_len,
            opened.max_new_tokens,
        )
        return entry

    async def Generate(self, request, context):
        """Cloud-only decoding: the target generates every token and streams it down."""
        entry = None
        try:
            self._count_in(request)
            entry = await self._new_session(self._parse_request(request), 0)
            session = entry.session
            while not session.done:
                verdict, seconds = await self._run_verify(
                    entry, session.epoch, len(session.tokens), [], None, time.perf_counter()
                )
                encoded = codec.encode_tokens([verdict.token] if verdict.token is not None else [], self.engine.vocab_size)
                yield self._count_out(
                    pb.GenerateChunk(
                        tokens=encoded.data,
                        compressed=encoded.compressed,
                        done=verdict.done,
                        stop_reason=stop_reason_to_proto(verdict.stop_reason),
                        server_us=server_us(seconds),
                        forwards=session.forwards if verdict.done else 0,
                    )
                )
        except _Abort as exc:
            self.metrics.sessions_failed.labels(code=exc.code.name).inc()
            await context.abort(exc.code, str(exc))
        finally:
            self._end(entry, True)
