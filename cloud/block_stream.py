"""The block stream: a Decode stream's Draft frames in, one verdict per block out.

Contract. ``read_frames`` moves an open stream's frames into a queue (a Close
or the end of the stream ends it); ``decode_draft`` turns a Draft into a
``PendingBlock``, decoding no more than the session's limits allow;
``verdicts`` verifies what is pending, the chain at its front in one forward
on the engine thread, and yields one ``Answered`` per block in order (a frame
of ``Draft.empty_blocks`` stands for that many blocks). A bad frame
(rejection-mode drafts the session's audit refuses included), a block past the
session's draft length, more than ``max_blocks_in_flight`` blocks waiting (or
in one frame), or an idle stream is an ``Abort`` of this stream alone (an idle
one parks its session). A session another stream
has resumed is never verified here. Every verify is observed once, in
``ServiceMetrics`` and the recent-latency windows; ``hints`` are what a new
stream's headers tell the edge (``shared.wire.StreamHints``). It opens no session and
writes nothing to the stream (``cloud.handshake``, ``cloud.servicer``).
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections import deque
from dataclasses import replace
from typing import NamedTuple

import grpc

from cloud.decode_ahead import breaks_chain, decode_ahead_steps, decodes_ahead
from cloud.frame_queue import FrameQueue
from cloud.limits import ServiceLimits
from cloud.metrics import client_bucket
from cloud.next_block import NextBlockClock
from cloud.service_part import ServicePart
from cloud.session import BlockRejected, ForgedDraft, PendingBlock, StepResult, VerifierSession
from cloud.session_table import SessionEntry
from cloud.stream_end import Abort, parsed
from protos import splitspec_pb2 as pb
from shared import codec
from shared.stats import RoundRecord
from shared.verdict import Verdict
from shared.wire import MAX_EARLY_DRAFTS, StreamHints, message_wire_bytes, verdict_to_proto

__all__ = ["Answered", "BlockStream", "CLOSE", "EOF", "read_frame", "verdict_message"]

log = logging.getLogger(__name__)

EOF = object()  # the edge hung up without a Close: the session stays resumable
CLOSE = object()  # the edge sent Close
QUEUED_BYTES = 256 << 10  # a stream's frames read and not yet verified, at most (an honest edge's: kilobytes)
_TOKEN_TIME_WINDOW = 32  # tokens decoded alone that ``BlockStream.hints`` takes the median of


class Answered(NamedTuple):
    """A block's verdict, the cloud's seconds since the block arrived, the forward's alone (0: none)
    and the session's rows in it (0: none, or more than one forward answered the chain)."""

    verdict: Verdict
    seconds: float
    forward_s: float
    forward_rows: int = 0


def verdict_message(answer: Answered, forwards: int) -> pb.Verdict:
    """``answer`` for the wire; the session's ``forwards`` ride on the final verdict only (0 is not
    sent, so rounds pay no bytes for it)."""
    return verdict_to_proto(answer.verdict, seconds=answer.seconds, forward_s=answer.forward_s,
                            forward_rows=answer.forward_rows, forwards=forwards if answer.verdict.done else 0)


async def read_frame(context, timeout: float):
    """The next frame, or ``grpc.aio.EOF`` when the edge hung up or the stream broke."""
    try:
        frame = await asyncio.wait_for(context.read(), timeout)
    except TimeoutError as exc:
        raise Abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"no frame from the edge for {timeout:.0f}s") from exc
    except Exception as exc:
        if context.cancelled() or context.done():  # the stream broke: its session stays resumable
            return grpc.aio.EOF
        # gRPC's deserializer raised (a server without ``ParseRequests``): bytes that are not an EdgeFrame
        raise Abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed frame: {type(exc).__name__}") from exc
    return parsed(frame)  # bytes that are not an EdgeFrame (``ParseRequests``)


def _idle() -> Abort:
    """The end of a stream whose session committed nothing for too long: parked (its slot can go to another client)."""
    return Abort(
        grpc.StatusCode.DEADLINE_EXCEEDED,
        "no block that commits a token for too long; the session is parked (resume it with its ticket)",
        park=True,
    )


async def _next_frame(frames: asyncio.Queue, timeout_s: float):
    """The next item of ``frames``; ``_idle`` after ``timeout_s``."""
    if timeout_s <= 0:
        raise _idle()
    try:
        return await asyncio.wait_for(frames.get(), timeout_s)
    except TimeoutError as exc:
        raise _idle() from exc


def _check_in_flight(pending: list[PendingBlock], limits: ServiceLimits) -> None:
    """Refuse a stream with more blocks waiting than ``limits`` allow: ``max_blocks_in_flight`` with
    drafts, ``max_empty_blocks`` empty (a token each, as a cloud stretch sends them)."""
    empty = sum(not block.drafts for block in pending)
    if len(pending) - empty > limits.max_blocks_in_flight:
        raise Abort(grpc.StatusCode.INVALID_ARGUMENT, f"more than {limits.max_blocks_in_flight} blocks in flight")
    if empty > limits.max_empty_blocks:
        raise Abort(grpc.StatusCode.INVALID_ARGUMENT, f"more than {limits.max_empty_blocks} empty blocks in flight")


class BlockStream(ServicePart):
    """Verifies the blocks of the service's streams on ``scheduler``'s engine thread."""

    def __post_init__(self) -> None:
        # The latest per-verify service times outside the forward, seconds (for benchmarks and debugging).
        self.recent_overheads_s: deque[float] = deque(maxlen=10_000)
        self.recent_latencies_s: deque[float] = deque(maxlen=1_000)  # block arrival -> verdict, per chain
        # Forward seconds per token of the latest tokens decoded alone (empty blocks: Generate, a cloud
        # stretch), for sessions that are not reproducible and for those that are (their shapes differ).
        self.recent_token_s = {False: deque(maxlen=_TOKEN_TIME_WINDOW), True: deque(maxlen=_TOKEN_TIME_WINDOW)}

    def hints(self) -> StreamHints:
        """What a new stream's headers say: the median of the recent seconds per token decoded alone, of
        each kind of session (0: none decoded yet), and the blocks a session may have in flight."""
        pace = {kind: statistics.median(times) if times else 0.0 for kind, times in self.recent_token_s.items()}
        return StreamHints(pace[False], pace[True], self.limits.max_blocks_in_flight)

    # -- frames in ---------------------------------------------------------
    def frame_queue(self) -> FrameQueue:
        """A stream's queue of frames read and not yet taken by its verdict loop (``cloud.frame_queue``):
        ``max_blocks_in_flight`` + 2 frames and ``QUEUED_BYTES`` at most; past that, ``read_frames`` waits."""
        return FrameQueue(self.limits.max_blocks_in_flight + 2, QUEUED_BYTES)

    async def read_frames(self, context, frames: asyncio.Queue) -> None:
        """Move the edge's frames into ``frames`` (``frame_queue``) as (Draft, arrival time), waiting
        while it is full; then ``EOF`` when the stream ends, ``CLOSE`` on a Close, or the ``Abort`` for a
        problem."""
        try:
            while True:
                frame = await read_frame(context, self.limits.session_ttl_s)
                if frame is grpc.aio.EOF:
                    await frames.put(EOF)
                    return
                self.metrics.bytes_in.inc(message_wire_bytes(frame))
                kind = frame.WhichOneof("kind")
                if kind == "close":
                    await frames.put(CLOSE)
                    return
                if kind != "draft":
                    raise Abort(grpc.StatusCode.INVALID_ARGUMENT, f"unexpected {kind or 'empty'} frame in an open session")
                await frames.put((frame.draft, time.perf_counter()))
        except Abort as exc:
            await frames.put(exc)

    def decode_draft(self, entry: SessionEntry, draft: pb.Draft) -> PendingBlock | None:
        """A Draft frame as a pending block (one of an older epoch is stale: answered without
        verification, its ids kept only as spare drafts when the session rebases, its q̃ and branches
        never decoded); None for a block sent before the Opened that exceeds the session's draft
        length (dropped unanswered)."""
        session = entry.session
        if draft.empty_blocks > 1:
            if draft.payload or draft.branches or draft.more_follows or draft.before_opened:
                raise Abort(grpc.StatusCode.INVALID_ARGUMENT, "bad draft block: empty_blocks on a block that is not empty")
            if draft.empty_blocks > self.limits.max_empty_blocks:
                raise Abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad draft block: {draft.empty_blocks} empty blocks, "
                            f"the limit is {self.limits.max_empty_blocks}")
        stale = draft.epoch < session.epoch
        if stale and not session.rebases:
            return PendingBlock(draft.epoch, draft.start_position, [], more_follows=False)
        params = session.params
        try:
            tokens, q = codec.decode_draft(
                draft.payload,
                draft.compressed,
                self.engine.vocab_size,
                max_tokens=(max(MAX_EARLY_DRAFTS, session.draft_limit.opened) if draft.before_opened
                            else session.draft_limit.for_epoch(draft.epoch)),
                draft_top_k=params.draft_top_k if params.sends_q else None,
                prob_bits=params.prob_bits if params.sends_q else None,
            )
            if stale:  # its ids are spare drafts for a stale block's forward; its branches, nothing
                return PendingBlock(draft.epoch, draft.start_position, tokens.tolist(), more_follows=False)
            if len(draft.branches) > session.policy.max_branches:  # checked before decoding any of them
                raise ValueError(f"{len(draft.branches)} branches, the limit is {session.policy.max_branches}")
            branches = tuple(
                (branch.at, codec.decode_tokens(branch.payload, branch.compressed, self.engine.vocab_size,
                                                max_tokens=session.draft_limit.opened).tolist())
                for branch in draft.branches
            )
        except ValueError as exc:
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad draft block: {exc}") from exc
        if draft.before_opened and len(tokens) > session.draft_limit.opened:
            log.debug("session %s: dropped a %d-draft block sent before the Opened", entry.session_id, len(tokens))
            return None
        return PendingBlock(draft.epoch, draft.start_position, tokens.tolist(), q, draft.more_follows, branches)

    # -- verification ------------------------------------------------------
    async def _verify_pending(
        self,
        entry: SessionEntry,
        pending: list[PendingBlock],
        stream: int,
        stale_decode_deadline: float | None = None,
    ) -> list[Answered]:
        """Verify the next chain of ``pending`` in one forward on the engine thread, observed once.

        ``stream``: the session's stream number this caller holds; once a resume
        has taken the session over, nothing is verified (checked on the engine
        thread, where every change to the session happens).
        ``stale_decode_deadline``: when the edge's next block is expected (``VerifierSession.verify_chain_steps``).
        Returns an ``Answered`` per block answered.
        """
        session = entry.session

        def verify_if_current():
            return self._accounted(entry, session.verify_chain_steps(pending, stale_decode_deadline)) \
                if entry.stream == stream else None

        forward_before, forwards_before = session.seq.forward_s, session.forwards
        waiting = list(pending)  # the step removes what it answers
        step = await self._run(entry, stream, verify_if_current)
        self.table.touch(entry, sum(v.committed_count for v in step.verdicts))
        return self._observe(session, step, waiting[:len(step.verdicts)], forwards_before, forward_before)

    def _accounted(self, entry: SessionEntry, steps):
        """Run a session's step (``steps``) and charge what it fed to its client (fair share: a client whose
        drafts are next to never accepted gets its blocks held short); its verdicts say the lowered limit."""
        session = entry.session
        step = yield from steps  # (on the engine thread, where the step ran: no later step can come between)
        if step.rows:
            self.metrics.observe_step(rows=step.rows, seconds=step.seconds)
            # The cloud's own proposals are neither the client's rows nor its tokens.
            rows, committed = step.client_rows, step.client_tokens
            ledger = self.scheduler.ledger  # (acceptance over every draft row the forward fed)
            ledger.record(entry.owner, rows=rows, committed=committed, drafted=step.drafts,
                          accepted=step.drafts_accepted)
            capped = ledger.capped(entry.owner)
            self.metrics.observe_client(entry.owner, rows=rows, committed=committed, capped=capped)
            if capped and self.limits.capped_draft_len and session.penalise(self.limits.capped_draft_len):
                log.info("session %s: its client (metrics bucket %s) has next to no drafts accepted: its blocks "
                         "are held to %d drafts", entry.session_id, client_bucket(entry.owner),
                         session.draft_limit.lowered)
        if session.draft_limit.lowered:  # every verdict says so (the edge obeys from the first it reads)
            step = replace(step, verdicts=[replace(v, draft_limit=session.draft_limit.lowered) for v in step.verdicts])
        return step

    async def _run(self, entry: SessionEntry, stream: int, step_if_current) -> StepResult:
        """Run ``step_if_current`` for the session on the engine thread; a refused block, a session that gave
        its slot away or was resumed on another stream ends this stream (``Abort``)."""
        try:
            step = await self.scheduler.run(step_if_current, entry.session, client=entry.owner)
        except BlockRejected as exc:
            if isinstance(exc, ForgedDraft):
                self.metrics.forged_drafts.labels(check=exc.check).inc()
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        if step is None and entry.preempted:
            raise Abort(grpc.StatusCode.ABORTED,
                        "the session gave its slot to a new one: the verifier is full, and it committed fewer than "
                        f"{self.table.min_tokens} tokens in {self.table.window_s:.0f}s or its client holds more "
                        "sessions than the newcomer's; reopen with the committed tokens as the prompt")
        if step is None:
            raise Abort(grpc.StatusCode.ABORTED, "the session was resumed on another stream", park=True)
        return step

    def _observe(self, session: VerifierSession, step: StepResult, blocks: list[PendingBlock],
                 forwards_before: int, forward_before: float) -> list[Answered]:
        """The chain's verdicts as ``Answered`` (``blocks``: the pending blocks they answer, as they
        arrived), each observed once; its forward counts for its first block."""
        now = time.perf_counter()
        out = []
        forwards = session.forwards - forwards_before
        forward_s = session.seq.forward_s - forward_before if forwards else 0.0
        forward_rows = step.rows if forwards == 1 else 0  # (one point of the cost curve)
        overhead = 0.0
        for i, (verdict, block) in enumerate(zip(step.verdicts, blocks)):
            arrived, start, drafts = block.arrived_at, block.start_position, len(block.drafts)
            # Verified drafts only: a stale block's were not, drafts before the verdict's start were committed.
            # (Drafts that matched tokens decoded ahead were not verified by this forward either.)
            drafted = 0 if verdict.stale else max(drafts - (verdict.start_position - start) - verdict.ahead, 0)
            seconds = now - arrived
            out.append(Answered(verdict, seconds, forward_s, forward_rows))
            if i == 0:  # the chain shared one forward: its cost and overhead go to its first block
                tokens = verdict.committed_count - verdict.ahead  # (those decoded ahead ran in earlier forwards)
                if forwards == 1 and not drafts and not verdict.stale and tokens:  # decoded alone
                    self.recent_token_s[session.params.reproducible].append(forward_s / tokens)
                overhead = max(seconds - forward_s, 0.0)
                self.recent_overheads_s.append(overhead)
                self.recent_latencies_s.append(seconds)
            self.metrics.observe_round(
                RoundRecord(
                    drafted=drafted,
                    accepted=verdict.accepted - min(verdict.ahead, verdict.accepted),
                    committed=verdict.committed_count,
                    forwards=forwards if i == 0 else 0,
                ),
                latency_s=seconds,
                overhead_s=overhead if i == 0 else 0.0,
            )
        return out

    async def _decode_ahead(self, entry: SessionEntry, stream: int) -> list[Answered]:
        """The session's next token, decoded before the edge's next block comes (``cloud.decode_ahead``):
        held for that block's verdict, its forward charged to the client. Returns no verdict, or the final
        one no block asked for, where that token ended the session and the edge takes it (observed as a
        verdict for an empty block asked at once, its tokens credited to the client)."""
        session = entry.session
        forward_before, forwards_before = session.seq.forward_s, session.forwards
        step = await self._run(entry, stream, lambda: self._accounted(entry, decode_ahead_steps(session))
                               if entry.stream == stream else None)
        if not step.verdicts:
            return []
        self.table.touch(entry, sum(v.committed_count for v in step.verdicts))
        asked = PendingBlock(session.epoch, step.verdicts[0].start_position, [], arrived_at=time.perf_counter())
        return self._observe(session, step, [asked], forwards_before, forward_before)

    async def decode_alone(self, entry: SessionEntry, arrived: float, stream: int) -> Answered:
        """The session's next token, decoded alone (an empty block that arrived at ``arrived``)."""
        position = len(entry.session.tokens)
        (answered,) = await self._verify_pending(
            entry, [PendingBlock(entry.session.epoch, position, [], arrived_at=arrived)], stream
        )
        return answered

    # -- the verdict loop --------------------------------------------------
    async def verdicts(self, entry: SessionEntry, stream: int, frames: asyncio.Queue, ending: list):
        """``Answered`` verdicts for the blocks read from ``frames``, one per block, in
        order: each step answers the chain at the front of what is pending, in one forward
        (``VerifierSession.verify_chain``), or one stale block.

        Stops when the edge closes or hangs up (``ending`` gets ``CLOSE`` or
        ``EOF``); refuses more blocks waiting than the limits allow (``_check_in_flight``); with nothing pending after a
        verdict that breaks the edge's chain, decodes ahead while ``decodes_ahead`` says so (and shows
        the session the new chain's first block: ``ChainStartGuesses``), yielding the final verdict
        unasked where that ends the session and the edge takes it (``Open.takes_unasked_end``);
        parks a session none of whose verdicts committed a token for
        ``idle_timeout_s``, whatever the stream sends (stale blocks keep no slot).
        """
        pending: list[PendingBlock] = []
        idle_s = self.limits.idle_timeout_s
        progress = time.monotonic()  # the last verdict that committed a token (or the open): stale ones do not count
        next_block = NextBlockClock()  # no stale decode that would still run when the edge's next block is due
        broken_chain = False  # the last verdict left the edge to start a new chain (``breaks_chain``)
        while not ending:
            if time.monotonic() - progress > idle_s:  # (however fast blocks that commit nothing come)
                raise _idle()
            if pending:
                items = []
            elif broken_chain and frames.empty() and decodes_ahead(entry.session, next_block.deadline()):
                for answer in await self._decode_ahead(entry, stream):  # (the final verdict, unasked: the end)
                    yield answer
                items = []
            else:
                items = [await _next_frame(frames, idle_s - (time.monotonic() - progress))]
            while not frames.empty():
                items.append(frames.get_nowait())
            for item in items:
                if isinstance(item, Abort):
                    raise item
                if item is EOF or item is CLOSE:
                    ending.append(item)
                    break
                block = self.decode_draft(entry, item[0])
                if block is None:
                    continue
                # (``Draft.empty_blocks``: one frame for that many empty blocks at consecutive positions)
                pending.extend(replace(block, start_position=block.start_position + i, arrived_at=item[1])
                               for i in range(max(item[0].empty_blocks, 1)))
                next_block.arrived(item[1], item[0].epoch)
                _check_in_flight(pending, self.limits)
            if pending and not ending:  # one chain at a time: a stale block's answer depends on what arrived
                session, front = entry.session, pending[0]
                epoch, told = session.epoch, session.ahead.told_from(len(session.tokens))
                answered = await self._verify_pending(entry, pending, stream, next_block.deadline())
                if broken_chain and front.epoch == epoch and front.drafts and front.start_position <= told:
                    session.ahead.guesses.observe(front.drafts, front.start_position, told, session.tokens)
                for answer in answered:
                    yield answer
                    if answer.verdict.committed_count:
                        progress = time.monotonic()
                broken_chain = breaks_chain(answered[-1].verdict)
                if session.epoch != epoch:
                    next_block.corrected(time.perf_counter(), session.epoch)

    async def finished(self, session: VerifierSession, frames: asyncio.Queue, ending: list) -> bool:
        """Whether the session is done with once the verdict loop stops: the edge closed, or it has the
        final verdict (``_acknowledged``). False keeps it resumable."""
        if session.done and not ending:
            return await self._acknowledged(frames)
        return session.done or CLOSE in ending

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
            if item is EOF:
                return False
            if item is CLOSE or isinstance(item, Abort):
                return True
