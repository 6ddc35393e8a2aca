"""The gRPC servicer: a thin shell over sessions and the engine.

Every frame is untrusted. Problems with a frame end only its own stream with
``INVALID_ARGUMENT`` (bad payload, wrong position, too long a block, a frame
before Open), ``FAILED_PRECONDITION`` (vocabulary mismatch) or
``RESOURCE_EXHAUSTED`` (session table or KV budget full); other streams never notice.
Torch work runs on the scheduler's engine thread, off the event loop, so a
long forward never stalls the other streams' I/O; the scheduler packs what
every session waits for into shared forwards (``cloud.scheduler``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import NamedTuple

import grpc

from cloud.engine import TargetEngine
from cloud.limits import ServiceLimits
from cloud.metrics import ServiceMetrics
from cloud.next_block import NextBlockClock
from cloud.scheduler import Scheduler
from cloud.session import BlockRejected, PendingBlock, VerifierSession
from cloud.session_table import SessionEntry, SessionTable, TableFull, owner_of
from protos import splitspec_pb2 as pb
from protos import splitspec_pb2_grpc as pb_grpc
from shared import codec
from shared.stats import RoundRecord
from shared.verdict import Verdict
from shared.vocab import describe_vocab
from shared.wire import (
    MAX_EARLY_DRAFTS,
    REPLICA_HEADER,
    OpenRequest,
    message_wire_bytes,
    parse_open_request,
    server_us,
    stop_reason_to_proto,
    verdict_to_proto,
)

__all__ = ["ServiceLimits", "VerifierServicer"]

log = logging.getLogger(__name__)


_EOF = object()  # the edge hung up without a Close: the session stays resumable
_CLOSE = object()  # the edge sent Close


_LOG_LINES_PER_S = 20  # session-end log lines per second at most


class Answered(NamedTuple):
    """A block's verdict, the cloud's seconds since the block arrived, and the forward's alone (0: none)."""

    verdict: Verdict
    seconds: float
    forward_s: float


def _verdict_message(answer: Answered, forwards: int) -> pb.Verdict:
    """``answer`` for the wire; the session's ``forwards`` ride on the final verdict only (0 is not
    sent, so rounds pay no bytes for it)."""
    return verdict_to_proto(answer.verdict, seconds=answer.seconds, forward_s=answer.forward_s,
                            forwards=forwards if answer.verdict.done else 0)


class _Abort(Exception):
    """Ends one stream with ``code``; ``park`` keeps its session resumable instead of dropping it."""

    def __init__(self, code: grpc.StatusCode, message: str, park: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.park = park


class VerifierServicer(pb_grpc.VerifierServicer):
    def __init__(
        self, engine: TargetEngine, limits: ServiceLimits, metrics: ServiceMetrics | None = None, *, batching: bool = True
    ) -> None:
        self.engine = engine
        self.limits = limits
        self.metrics = metrics or ServiceMetrics()
        self.table = SessionTable(limits.max_sessions, limits.session_ttl_s, max_per_owner=limits.max_sessions_per_client,
                                  max_tokens=limits.max_kv_tokens)
        self._log_window_start, self._log_lines, self._log_skipped = 0.0, 0, 0
        # The latest per-verify service times outside the forward, seconds (for benchmarks and debugging).
        self.recent_overheads_s: deque[float] = deque(maxlen=10_000)
        self.recent_latencies_s: deque[float] = deque(maxlen=1_000)  # block arrival -> verdict, per chain
        self.replica = ""  # this replica's name, told to edges in Opened (their key to its MQTT load)
        # One engine thread: sessions' forwards are packed together; torch parallelises inside each.
        self.scheduler = Scheduler(engine, max_rows=limits.max_batch_rows, batching=batching,
                                   min_prefill_rows=min(32, limits.max_batch_rows), on_forward=self.metrics.observe_forward)

    @property
    def max_branches(self) -> int:
        """Hedge branches a block may carry here (none where the engine cannot verify a tree)."""
        return 0 if self.engine.leader is not None else self.limits.max_branches

    @property
    def engine_queue(self) -> int:
        """Engine jobs submitted and not finished (the running ones included)."""
        return self.scheduler.pending

    # -- helpers -----------------------------------------------------------
    async def _in_engine(self, fn, key: object = None):
        """``fn`` on the engine thread (after the earlier jobs of ``key``, a session); drives its steps."""
        return await self.scheduler.run(fn, key)

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

    def _log_end(self, entry: SessionEntry | None, exc: _Abort) -> None:
        """One line per ended session, at most ``_LOG_LINES_PER_S`` a second: a flood of bad
        streams cannot flood the log (the skipped count goes on the next line)."""
        now = time.monotonic()
        if now - self._log_window_start >= 1.0:
            self._log_window_start, self._log_lines = now, 0
        self._log_lines += 1
        if self._log_lines > _LOG_LINES_PER_S:
            self._log_skipped += 1
            return
        skipped = f" ({self._log_skipped} more not logged)" if self._log_skipped else ""
        self._log_skipped = 0
        log.info("session %s ended: %s: %s%s", entry.session_id if entry else "-", exc.code.name, exc, skipped)

    async def _new_session(self, opened: OpenRequest, max_draft_len: int, owner: str,
                           takes_rebased: bool = False) -> SessionEntry:
        """``takes_rebased``: the edge reads stale verdicts' rebased drafts (``Open.takes_rebased``)."""
        params, prompt, max_new_tokens = opened.params, opened.prompt, opened.max_new_tokens
        try:
            # Refuse before spending a prefill on a session that cannot be kept.
            self.table.reserve(owner, len(prompt) + max_new_tokens)

            def open_session():
                session = VerifierSession(
                    self.engine, prompt, params, max_new_tokens=max_new_tokens, max_draft_len=max_draft_len,
                    max_branches=self.max_branches, decode_stale=self.limits.decode_stale,
                    rebase_stale=self.limits.rebase_stale and takes_rebased,
                    prefill=False,
                )
                yield from session.prefill_steps()
                return session

            session = await self._in_engine(open_session)
            # Checks again: others may have opened during the prefill.
            entry = self.table.add(session, owner, len(prompt) + max_new_tokens)
        except TableFull as exc:
            raise _Abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)) from exc
        except ValueError as exc:  # the session refused the request (e.g. longer than the target's context)
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
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
        """The next frame, or ``grpc.aio.EOF`` when the edge hung up or the stream broke."""
        try:
            return await asyncio.wait_for(context.read(), timeout)
        except TimeoutError as exc:
            raise _Abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"no frame from the edge for {timeout:.0f}s") from exc
        except Exception as exc:
            if context.cancelled() or context.done():  # the stream broke: its session stays resumable
                return grpc.aio.EOF
            # gRPC's deserializer raised: bytes that are not an EdgeFrame
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed frame: {type(exc).__name__}") from exc

    def _decode_draft(self, entry: SessionEntry, draft: pb.Draft) -> PendingBlock | None:
        """A Draft frame as a pending block (one of an older epoch is stale: answered without
        verification, its ids kept only as spare drafts when the session rebases, its q̃ and branches
        never decoded); None for a block sent before the Opened that exceeds the session's draft
        length (dropped unanswered)."""
        session = entry.session
        stale = draft.epoch < session.epoch
        if stale and not session.rebases:
            return PendingBlock(draft.epoch, draft.start_position, [], more_follows=False)
        params = session.params
        try:
            tokens, q = codec.decode_draft(
                draft.payload,
                draft.compressed,
                self.engine.vocab_size,
                max_tokens=max(MAX_EARLY_DRAFTS, session.max_draft_len) if draft.before_opened else session.max_draft_len,
                draft_top_k=params.draft_top_k if params.sends_q else None,
                prob_bits=params.prob_bits if params.sends_q else None,
            )
            if stale:  # its ids are spare drafts for a stale block's forward; its branches, nothing
                return PendingBlock(draft.epoch, draft.start_position, tokens.tolist(), more_follows=False)
            if len(draft.branches) > session.max_branches:  # checked before decoding any of them
                raise ValueError(f"{len(draft.branches)} branches, the limit is {session.max_branches}")
            branches = tuple(
                (branch.at, codec.decode_tokens(branch.payload, branch.compressed, self.engine.vocab_size,
                                                max_tokens=session.max_draft_len).tolist())
                for branch in draft.branches
            )
        except ValueError as exc:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad draft block: {exc}") from exc
        if draft.before_opened and len(tokens) > session.max_draft_len:
            log.debug("session %s: dropped a %d-draft block sent before the Opened", entry.session_id, len(tokens))
            return None
        return PendingBlock(draft.epoch, draft.start_position, tokens.tolist(), q, draft.more_follows, branches)

    async def _verify_pending(
        self,
        entry: SessionEntry,
        pending: list[PendingBlock],
        received: deque[tuple[float, int, int]],
        stream: int,
        fill_deadline: float | None = None,
    ) -> list[Answered]:
        """Verify the next chain of ``pending`` in one forward on the engine thread, observed once.

        ``received``: (arrival time, start position, drafts) of each pending block, in the same order.
        ``stream``: the session's stream number this caller holds; once a resume
        has taken the session over, nothing is verified (checked on the engine
        thread, where every change to the session happens).
        ``fill_deadline``: when the edge's next block is expected (``VerifierSession.verify_chain_steps``).
        Returns an ``Answered`` per block answered.
        """
        session = entry.session

        def observed():  # (on the engine thread, where the step ran: no later step can come between)
            verdicts = yield from session.verify_chain_steps(pending, fill_deadline)
            if session.last_step_rows:
                self.metrics.observe_step(rows=session.last_step_rows, seconds=session.last_step_s)
            return verdicts

        def verify_if_current():
            return observed() if entry.stream == stream else None

        forward_before, forwards_before = session.seq.forward_s, session.forwards
        try:
            verdicts = await self._in_engine(verify_if_current, session)
        except BlockRejected as exc:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        if verdicts is None:
            raise _Abort(grpc.StatusCode.ABORTED, "the session was resumed on another stream", park=True)
        now = time.perf_counter()
        self.table.touch(entry)
        out = []
        forwards = session.forwards - forwards_before
        forward_s = session.seq.forward_s - forward_before if forwards else 0.0
        overhead = 0.0
        for i, verdict in enumerate(verdicts):
            arrived, start, drafts = received.popleft()
            # Verified drafts only: a stale block's were not, drafts before the verdict's start were committed.
            drafted = 0 if verdict.stale else max(drafts - (verdict.start_position - start), 0)
            seconds = now - arrived
            out.append(Answered(verdict, seconds, forward_s))
            if i == 0:  # the chain shared one forward: its cost and overhead go to its first block
                overhead = max(seconds - forward_s, 0.0)
                self.recent_overheads_s.append(overhead)
                self.recent_latencies_s.append(seconds)
            self.metrics.observe_round(
                RoundRecord(
                    drafted=drafted,
                    accepted=verdict.accepted,
                    committed=verdict.accepted + (verdict.token is not None) + len(verdict.rebased)
                    + (1 + verdict.branch_accepted if verdict.branch else 0),
                    forwards=forwards if i == 0 else 0,
                ),
                latency_s=seconds,
                overhead_s=overhead if i == 0 else 0.0,
            )
        return out

    async def _decode_alone(self, entry: SessionEntry, arrived: float, stream: int) -> Answered:
        """The session's next token, decoded alone (an empty block that arrived at ``arrived``)."""
        position = len(entry.session.tokens)
        (answered,) = await self._verify_pending(
            entry, [PendingBlock(entry.session.epoch, position, [])], deque([(arrived, position, 0)]), stream
        )
        return answered

    # -- RPCs --------------------------------------------------------------
    async def Decode(self, request_iterator, context):
        entry = None
        stream = 0  # the session's stream number while this stream drives it
        finished = False
        try:
            # Answer the headers now: an edge may open its stream ahead of the prompt
            # (``GrpcVerifier.connect(stream=True)``); the Opened then travels without them.
            await context.send_initial_metadata(())
            first = await self._read(context, self.limits.open_timeout_s)
            if first is grpc.aio.EOF:
                return
            self._count_in(first)
            if first.WhichOneof("kind") != "open":
                raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"the first frame must be Open, got {first.WhichOneof('kind') or 'an empty frame'}")
            answer_first = first.open.first_token
            opened_at = time.perf_counter()  # the first verdict's cloud time counts from the Open (prefill included)
            # The stream number is the one this stream's attach got: another resume may bump it
            # while we wait on the engine, and then this stream must not drive the session.
            if first.open.resume_ticket:
                self._check_routing(context)
            if first.open.resume_ticket and first.open.extend:
                entry, stream = await self._extend(first.open, self._owner(context))
                opened = pb.Opened(committed_length=len(entry.session.tokens))
            elif first.open.resume_ticket:
                entry, stream, opened = await self._resume(first.open, self._owner(context))
                answer_first = answer_first and not entry.session.done
            else:
                entry = await self._open(first.open, self._owner(context))
                stream = entry.stream  # no await since the table added it
                opened = pb.Opened(committed_length=len(entry.session.tokens))
            session = entry.session
            if answer_first:  # the first position, answered from the prefill's last row, rides with the Opened
                first_answer = await self._decode_alone(entry, opened_at, stream)
                opened.first_verdict.CopyFrom(_verdict_message(first_answer, session.forwards))
            opened.MergeFrom(
                pb.Opened(
                    resume_ticket=entry.ticket,
                    vocab_size=self.engine.vocab_size,
                    max_draft_len=session.max_draft_len,
                    forwards=session.forwards,
                    max_blocks_in_flight=self.limits.max_blocks_in_flight,
                    max_branches=session.max_branches,
                    replica=self.replica,
                )
            )
            yield self._count_out(pb.CloudFrame(opened=opened))
            if session.done and not answer_first:  # resumed after its final verdict was lost: the Opened told the rest
                finished = True
                return
            frames: asyncio.Queue = asyncio.Queue()
            ending: list = []  # _CLOSE or _EOF once the edge ends the stream
            reader = asyncio.create_task(self._read_frames(context, frames))
            try:
                if not session.done:  # (the first verdict may have been the last)
                    async for answer in self._verdicts(entry, stream, frames, ending):
                        yield self._count_out(pb.CloudFrame(verdict=_verdict_message(answer, session.forwards)))
                        if answer.verdict.done:
                            break
                if session.done and not ending:
                    finished = await self._acknowledged(frames)
                else:
                    finished = session.done or _CLOSE in ending
            finally:
                reader.cancel()
        except _Abort as exc:
            finished = not exc.park
            self.metrics.sessions_failed.labels(code=exc.code.name).inc()
            self._log_end(entry, exc)
            await context.abort(exc.code, str(exc))
        finally:
            if entry is not None and entry.stream == stream:  # else a newer stream drives the session now
                self._end(entry, finished)

    async def _read_frames(self, context, frames: asyncio.Queue) -> None:
        """Move the edge's frames into ``frames`` as (Draft, arrival time); then ``_EOF`` when the
        stream ends, ``_CLOSE`` on a Close, or the ``_Abort`` for a problem."""
        try:
            while True:
                frame = await self._read(context, self.limits.session_ttl_s)
                if frame is grpc.aio.EOF:
                    frames.put_nowait(_EOF)
                    return
                self._count_in(frame)
                kind = frame.WhichOneof("kind")
                if kind == "close":
                    frames.put_nowait(_CLOSE)
                    return
                if kind != "draft":
                    raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"unexpected {kind or 'empty'} frame in an open session")
                frames.put_nowait((frame.draft, time.perf_counter()))
        except _Abort as exc:
            frames.put_nowait(exc)

    async def _acknowledged(self, frames: asyncio.Queue) -> bool:
        """After the final verdict: whether the edge has it. The edge says so with a Close; when the
        stream ends without one (it may have broken on the final verdict, or the edge keeps the
        session for a conversation's next turn), the finished session stays resumable. Blocks the
        edge sent before the final verdict reached it are skipped; an edge that never answers gets
        the idle timeout."""
        deadline = time.monotonic() + self.limits.idle_timeout_s
        while True:
            try:
                item = await asyncio.wait_for(frames.get(), max(deadline - time.monotonic(), 0.0))
            except TimeoutError:
                return True
            if item is _EOF:
                return False
            if item is _CLOSE or isinstance(item, _Abort):
                return True

    @staticmethod
    async def _next_frame(frames: asyncio.Queue, timeout_s: float):
        """The next item of ``frames``; an idle stream is parked (its slot can go to another client)."""
        try:
            return await asyncio.wait_for(frames.get(), max(timeout_s, 0.0))
        except TimeoutError as exc:
            raise _Abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                "no block to verify for too long; the session is parked (resume it with its ticket)",
                park=True,
            ) from exc

    async def _verdicts(self, entry: SessionEntry, stream: int, frames: asyncio.Queue, ending: list):
        """``Answered`` verdicts for the blocks read from ``frames``, one per block, in
        order: each step answers the chain at the front of what is pending, in one forward
        (``VerifierSession.verify_chain``), or one stale block.

        Stops when the edge closes or hangs up (``ending`` gets ``_CLOSE`` or
        ``_EOF``); refuses more than ``max_blocks_in_flight`` blocks waiting.
        """
        pending: list[PendingBlock] = []
        received: deque[tuple[float, int, int]] = deque()
        idle_s = self.limits.idle_timeout_s
        progress = time.monotonic()  # the last verdict (or the open)
        next_block = NextBlockClock()  # no fill that would still run when the edge's next block is due
        while not ending:
            items = [] if pending else [await self._next_frame(frames, idle_s - (time.monotonic() - progress))]
            while not frames.empty():
                items.append(frames.get_nowait())
            for item in items:
                if isinstance(item, _Abort):
                    raise item
                if item is _EOF or item is _CLOSE:
                    ending.append(item)
                    break
                block = self._decode_draft(entry, item[0])
                if block is None:
                    continue
                pending.append(block)
                received.append((item[1], block.start_position, len(block.drafts)))
                next_block.arrived(item[1], item[0].epoch)
                if len(pending) > self.limits.max_blocks_in_flight:
                    raise _Abort(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"more than {self.limits.max_blocks_in_flight} blocks in flight",
                    )
            if pending and not ending:  # one chain at a time: a stale block's answer depends on what arrived
                epoch = entry.session.epoch
                answered = await self._verify_pending(entry, pending, received, stream, next_block.deadline())
                for answer in answered:
                    yield answer
                    progress = time.monotonic()
                if entry.session.epoch != epoch:
                    next_block.corrected(time.perf_counter(), entry.session.epoch)

    def _check_routing(self, context) -> None:
        """A resume or a next turn names the replica that holds its session; one that names another
        replica was misrouted (a proxy without affinity): counted, then answered as usual (the
        ticket is unknown here, so NOT_FOUND, and the edge reopens)."""
        named = str(dict(context.invocation_metadata() or ()).get(REPLICA_HEADER, ""))
        if named and self.replica and named != self.replica:
            self.metrics.misrouted.inc()
            log.info("a stream for replica %s reached replica %s", named, self.replica)

    @staticmethod
    def _owner(context) -> str:
        """Whom a stream's sessions count against: its bearer token, else its peer address."""
        metadata = dict(context.invocation_metadata() or ())
        token = str(metadata.get("authorization", "")).removeprefix("Bearer ") or None
        return owner_of(context.peer() or "", token)

    async def _resume(self, request: pb.Open, owner: str) -> tuple[SessionEntry, int, pb.Opened]:
        """Attach the session of ``request.resume_ticket`` to this stream; the Opened tells the edge
        what it missed: the session's epoch and the tokens committed past ``committed_length``.

        The answer depends only on the session's state, so verdicts lost in a cut
        are recovered once, whatever the edge had in flight. The state is read on
        the engine thread, after any verify a dead stream had queued.
        """
        entry = self.table.resume(request.resume_ticket, owner)
        if entry is None:
            raise _Abort(grpc.StatusCode.NOT_FOUND, "no resumable session for that ticket; reopen with the committed tokens as the prompt")
        session, stream = entry.session, entry.stream

        def missed() -> tuple[list[int], int, int]:
            if session.broken:
                raise LookupError("the session's last turn failed half-way")
            committed = len(session.tokens)
            if request.committed_length > committed:
                raise ValueError(
                    f"resume from {request.committed_length} committed tokens, but the session has {committed}"
                )
            start = max(request.committed_length, session.prompt_len)  # below the prompt reads as the prompt
            return session.tokens[start:], session.epoch, committed

        try:
            tail, epoch, committed = await self._in_engine(missed, session)
        except LookupError as exc:
            if entry.stream == stream:
                self._end(entry, True)
            raise _Abort(grpc.StatusCode.NOT_FOUND, f"{exc}; reopen with the committed tokens as the prompt") from exc
        except ValueError as exc:
            if entry.stream == stream:
                self._end(entry, True)
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        except BaseException:  # the stream went away meanwhile: park the session again
            if entry.stream == stream:
                self._end(entry, False)
            raise
        encoded = codec.encode_tokens(tail, self.engine.vocab_size)
        self.metrics.sessions_resumed.inc()
        log.info("session %s resumed at %d committed tokens (%d the edge missed), epoch %d%s",
                 entry.session_id, committed, len(tail), epoch, ", already finished" if session.done else "")
        return entry, stream, pb.Opened(
            committed_length=committed,
            epoch=epoch,
            committed_tail=encoded.data,
            committed_tail_compressed=encoded.compressed,
            stop_reason=stop_reason_to_proto(session.stop_reason),
        )

    async def _extend(self, request: pb.Open, owner: str) -> tuple[SessionEntry, int]:
        """A new turn on the session of ``request.resume_ticket``: cut back to ``committed_length``
        tokens, append the request's prompt, decode anew with its sampling and limits."""
        entry = self.table.resume(request.resume_ticket, owner)
        if entry is None:
            raise _Abort(grpc.StatusCode.NOT_FOUND, "no session for that ticket; open a new one with the whole prompt")
        stream = entry.stream
        try:
            turn = self._parse_request(request)
            if request.committed_length + len(turn.prompt) > self.limits.max_prompt_tokens:
                raise _Abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"the conversation would hold {request.committed_length + len(turn.prompt)} prompt tokens, "
                    f"the limit is {self.limits.max_prompt_tokens}",
                )
            max_draft_len = min(request.max_draft_len or self.limits.max_draft_len, self.limits.max_draft_len)
            forwards_before = entry.session.forwards
            try:
                self.table.resize(entry, request.committed_length + len(turn.prompt) + turn.max_new_tokens)
            except TableFull as exc:
                raise _Abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)) from exc
            try:
                await self._in_engine(
                    lambda: entry.session.extend_steps(request.committed_length, turn.prompt, turn.params,
                                                       max_new_tokens=turn.max_new_tokens, max_draft_len=max_draft_len),
                    entry.session,
                )
            except ValueError as exc:
                raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        except _Abort:
            if entry.stream == stream:
                self._end(entry, True)
            raise
        except BaseException:  # the stream went away meanwhile: park the session again
            if entry.stream == stream:
                self._end(entry, False)
            raise
        self.metrics.observe_open(forwards=entry.session.forwards - forwards_before)
        log.info("session %s extended: kept %d tokens, appended %d, max %d new", entry.session_id,
                 request.committed_length, len(turn.prompt), turn.max_new_tokens)
        return entry, stream

    async def _open(self, request: pb.Open, owner: str) -> SessionEntry:
        opened = self._parse_request(request)
        max_draft_len = min(request.max_draft_len or self.limits.max_draft_len, self.limits.max_draft_len)
        entry = await self._new_session(opened, max_draft_len, owner, takes_rebased=request.takes_rebased)
        params = opened.params
        log.info(
            "session %s opened: %d prompt tokens, mode %s, T=%.2f, D<=%d, max %d new",
            entry.session_id, len(opened.prompt), params.mode.value, params.temperature, max_draft_len,
            opened.max_new_tokens,
        )
        return entry

    async def Generate(self, request, context):
        """Cloud-only decoding: the target generates every token and streams it down. The first
        chunk's ``server_us`` counts from the request (prefill included), as the first verdict's
        does from the Open."""
        entry = None
        try:
            self._count_in(request)
            arrived = time.perf_counter()
            entry = await self._new_session(self._parse_request(request), 0, self._owner(context))
            session = entry.session
            while not session.done:
                verdict, seconds, _ = await self._decode_alone(entry, arrived, entry.stream)
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
                arrived = time.perf_counter()
        except _Abort as exc:
            self.metrics.sessions_failed.labels(code=exc.code.name).inc()
            await context.abort(exc.code, str(exc))
        finally:
            self._end(entry, True)
