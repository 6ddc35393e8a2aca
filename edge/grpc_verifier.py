"""The edge's side of the wire: ``VerifierConnection`` over gRPC ``Decode`` streams.

Synchronous to the decode loop. Keeps the session's state (its ticket, the
blocks in flight, the terms the cloud granted) and the forward count the cloud
reports; the stream itself is ``edge.decode_stream``, the byte and RTT counts
``edge.link_meter``.

Resilience: a stream that breaks (or a cloud that stays silent past the
verdict timeout) raises ``LinkLost``; ``resume`` then reattaches the session
by its ticket on a new stream, or reopens it on the committed tokens when the
cloud lost it (a restart, the TTL), tried again within the outage budget
(``edge.channel.retry_while_lost``). Each recovery is recorded (``recoveries``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from edge.behind_the_open import BehindTheOpen
from edge.channel import retry_while_lost, wait_ready
from edge.decode_stream import STREAM_ANSWER_S, DecodeStream
from edge.drafter import DraftBlock, common_prefix_length
from edge.endpoint import VerifierEndpoint
from edge.link_meter import LinkMeter, SentBlock
from edge.opening import OpenRequest, open_message, session_terms
from edge.report import Recovery
from edge.verdict_checks import check_verdict_tokens
from edge.verifier_protocol import (
    CloudTiming,
    LinkHint,
    LinkLost,
    Received,
    Resumption,
    ServedBy,
    SessionTerms,
    VerifierError,
)
from protos import splitspec_pb2 as pb
from shared import codec
from shared.params import SamplingParams
from shared.verdict import StopReason
from shared.wire import StreamHints, message_wire_bytes, session_id_of, stop_reason_from_proto, verdict_from_proto

__all__ = ["GrpcVerifier"]

log = logging.getLogger(__name__)


class _SessionGone(Exception):
    """The cloud has no session for our ticket (restarted, expired, another replica)."""


def _metered(name: str) -> property:
    return property(lambda self: getattr(self.meter, name), doc=f"``LinkMeter.{name}`` of this session")


@dataclass(frozen=True)
class _Options:
    """How long the connection waits, and which session it continues."""

    verdict_timeout_s: float  # a verdict not come by then: the link is lost
    outage_budget_s: float  # how long a broken link may take to come back (0: a cut ends the session)
    continue_from: tuple[bytes, Sequence[int]] | None  # (ticket, every token it holds) of a session to extend


class GrpcVerifier:
    """One generation session with a remote verifier. Use once: open, send/receive..., close."""

    bytes_up = _metered("bytes_up")
    bytes_down = _metered("bytes_down")
    open_bytes = _metered("open_bytes")
    rtt_samples_s = _metered("rtt_samples_s")
    unasked = _metered("unasked")
    rtt_ms = _metered("rtt_ms")
    block_log = _metered("block_log")
    open_s = _metered("open_s")
    first_token_cloud_s = _metered("first_token_cloud_s")

    def __init__(
        self,
        endpoint: VerifierEndpoint,
        *,
        verdict_timeout_s: float = 120.0,
        outage_budget_s: float = 30.0,
        channel: grpc.Channel | None = None,
        keep_session: bool = False,
        continue_from: tuple[bytes, Sequence[int]] | None = None,
    ) -> None:
        """``channel``: an open channel to ``endpoint`` to reuse across sessions (the caller opens it,
        ``endpoint.open_channel()``, and closes it); default: our own, opened here.
        ``outage_budget_s``: how long a broken link may take to come back (0: a cut ends the session).
        ``keep_session``: ``close`` leaves the cloud session parked (a conversation's next turn
        continues it) instead of ending it. ``continue_from``: (ticket, every token the session
        holds) of such a session: ``open`` extends it, sending only what the new prompt adds."""
        self.endpoint = endpoint
        self.options = _Options(verdict_timeout_s, outage_budget_s, continue_from)
        self.keep_session = keep_session  # (a request cancelled meanwhile ends it after all)
        self._owns_channel = channel is None
        self._channel = channel if channel is not None else endpoint.open_channel()
        self._connected = False
        self.meter = LinkMeter()
        self._stream = DecodeStream(self._channel, endpoint.address, self.meter)
        self._request = OpenRequest()
        self.recoveries: list[Recovery] = []  # [broken streams recovered from]
        # Target forwards of this generation, prefill included: the cloud's count for the session
        # plus an offset (after a reopen, the lost session's as last reported; on a continued
        # conversation, minus the earlier turns').
        self.forwards = 0
        self._forwards_offset = 0
        self.resume_ticket = b""
        self.served_by = ServedBy()  # the replica and the target weights serving the session (Opened)
        self._lost_at: float | None = None  # when the stream broke, until the first verdict after it
        # Blocks not yet answered, oldest first: each gets exactly one verdict, in order.
        self._in_flight: deque[SentBlock] = deque()
        self._first_verdict: pb.Verdict | None = None  # the Opened's answer to the first position, not yet received
        self._behind_open = BehindTheOpen()  # the early block or head start ``open`` sends
        self.link_hint: LinkHint | None = None  # measured by ``connect(stream=True)``, or the caller's
        self._cloud_hints = StreamHints()  # what the session's stream headers said (``measured_link``)

    @property
    def session_id(self) -> str:
        """The session's id in logs (from its ticket; empty before the Opened)."""
        return session_id_of(self.resume_ticket) if self.resume_ticket else ""

    @property
    def prompt_tokens_sent(self) -> int:
        """Prompt tokens this session's Opens uploaded."""
        return self.meter.prompt_tokens

    # -- VerifierConnection ------------------------------------------------------
    def connect(self, *, stream: bool = False) -> None:
        """Establish the channel (TCP and HTTP/2 setup) now rather than on ``open``.

        ``stream``: also start the Decode stream and wait (at most ``STREAM_ANSWER_S``) for the
        cloud to answer its headers, so that ``open`` sends the Open alone: gRPC writes a stream's
        headers apart from its first message, and on a thin link that extra segment delays the
        first token (about 10 ms at 50 kbit/s). A stream unused for ``STREAM_MAX_IDLE_S`` is
        replaced on ``open`` (the cloud ends one that sends nothing for ``--open-timeout``). The
        headers' answer is timed, a round trip with no cloud work in it, and read for the cloud's
        hints (``shared.wire.StreamHints``): ``link_hint``."""
        if not self._connected:
            wait_ready(self._channel, self.endpoint.address, self.endpoint.connect_timeout_s)
            self._connected = True
        if stream and not self._stream.is_fresh():
            started = time.perf_counter()
            self._restart_call()
            headers = self._stream.wait_for_headers(STREAM_ANSWER_S)
            if headers is None:  # a verifier that answers them with its Opened
                log.debug("the cloud did not answer the stream's headers within %.0f s; going on", STREAM_ANSWER_S)
            elif headers:  # (empty: the call ended instead)
                self.link_hint = LinkHint(time.perf_counter() - started, StreamHints.from_metadata(headers))
                log.debug("before the Open: round trip %.0f ms; %s", self.link_hint.round_trip_s * 1e3,
                          self.link_hint.cloud)

    def open(self, prompt: Sequence[int], params: SamplingParams, max_new_tokens: int, max_draft_len: int,
             early_block=None, head_start: int = 0, pipelined: bool = False) -> SessionTerms:
        self.connect()
        self._request = OpenRequest(params, len(prompt), max_new_tokens, max_draft_len, pipelined)
        self._behind_open.arm(early_block, head_start)
        started = time.perf_counter()
        try:
            if self.options.continue_from is not None:
                terms = self._extend_session(prompt).terms
            else:
                terms = self._open_session(prompt).terms
        except LinkLost:  # broken before the Opened came: open again, as after any cut (no early block)
            self._lost_at = started
            terms = self.resume(prompt).terms
        finally:
            self._behind_open.arm(None, 0)
        self.meter.open_s = time.perf_counter() - started
        if self._first_verdict is not None:
            self.meter.first_token_cloud_s = self._first_verdict.server_us * 1e-6
        return terms

    def resume(self, committed: Sequence[int]) -> Resumption:
        if self._lost_at is None:
            self._lost_at = time.perf_counter()
        lost_at, up_before = self._lost_at, self.meter.bytes_up

        def attempt() -> Resumption:
            self._restart_call()  # fails fast (UNAVAILABLE) while the channel cannot connect
            if self.resume_ticket:
                try:
                    return self._reattach(committed)
                except _SessionGone:
                    log.info("session %s is gone from the cloud; reopening on %d committed tokens",
                             self.session_id, len(committed))
                    self._restart_call()  # the cloud ended that stream
            return self._open_session(committed)

        resumed, attempts = retry_while_lost(attempt, self.options.outage_budget_s,
                                             f"lost the cloud at {self.endpoint.address} and could not resume")
        reconnect_s = time.perf_counter() - lost_at
        self.recoveries.append(
            Recovery(
                reconnect_s=reconnect_s,
                attempts=attempts,
                reopened=resumed.reopened,
                missed_tokens=len(resumed.missed),
                up_bytes=self.meter.bytes_up - up_before,
                # A session that had ended is complete once we know its last tokens.
                recover_s=reconnect_s if resumed.stop_reason is not StopReason.NONE else 0.0,
            )
        )
        log.info(
            "session %s %s after %.2fs (%d attempts, %d tokens the cloud had committed meanwhile)",
            self.session_id, "reopened" if resumed.reopened else "resumed", self.recoveries[-1].reconnect_s,
            attempts, len(resumed.missed),
        )
        return resumed

    def send(self, epoch: int, start_position: int, block: DraftBlock, more_follows: bool, *,
             before_opened: bool = False, empty_blocks: int = 1) -> None:
        self._send(epoch, start_position, block, more_follows, before_opened=before_opened, empty_blocks=empty_blocks)

    def _send(self, epoch: int, start_position: int, block: DraftBlock, more_follows: bool, *,
              before_opened: bool = False, empty_blocks: int = 1) -> SentBlock:
        """``send``; returns the (first) block's record in flight."""
        if empty_blocks > 1 and (block.tokens or block.branches or more_follows or before_opened):
            raise ValueError("empty_blocks stands for empty blocks only")
        params, vocab_size = self._request.params, self.endpoint.vocab_size
        encoded = codec.encode_draft(
            block.tokens, vocab_size, block.q, draft_top_k=params.draft_top_k if block.q is not None else None
        )
        branches = []
        for at, tokens in block.branches:
            packed = codec.encode_tokens(tokens, vocab_size)
            branches.append(pb.Branch(at=at, payload=packed.data, compressed=packed.compressed))
        frame = pb.EdgeFrame(
            draft=pb.Draft(
                epoch=epoch,
                start_position=start_position,
                payload=encoded.data,
                compressed=encoded.compressed,
                more_follows=more_follows,
                branches=branches,
                before_opened=before_opened,
                empty_blocks=empty_blocks if empty_blocks > 1 else 0,
            )
        )
        now, frame_bytes = time.perf_counter(), message_wire_bytes(frame)
        sent = SentBlock(now, start_position, len(block.tokens), frame_bytes)
        self._in_flight.append(sent)
        self._in_flight.extend(SentBlock(now, start_position + i, 0, 0) for i in range(1, empty_blocks))
        self._stream.send(frame)
        return sent

    def receive(self) -> Received:
        if self._first_verdict is not None:  # it came inside the Opened (its bytes were counted there)
            message, self._first_verdict = self._first_verdict, None
            return self._take_verdict(message, message.ByteSize() + 2)
        reply = self._receive("verdict")
        return self._take_verdict(reply.verdict, message_wire_bytes(reply))

    def ready(self) -> bool:
        return self._first_verdict is not None or self._stream.has_frame()

    def _take_verdict(self, message: pb.Verdict, down_bytes: int) -> Received:
        """Account for one verdict (``down_bytes``: what it cost the downlink) and decode it."""
        arrived = time.perf_counter()
        if message.done:  # the total rides on the final verdict only
            self.forwards = self._forwards_offset + message.forwards
        check_verdict_tokens(message, self.endpoint.vocab_size, self._request.max_draft_len, self._request.takes_ahead)
        if not (message.unasked or self._in_flight):
            raise VerifierError(f"verdict for a block never sent (epoch {message.epoch}, position {message.start_position})")
        sent = None if message.unasked else self._in_flight.popleft()  # (the final verdict may answer none)
        if self._lost_at is not None and self.recoveries:  # the first verdict after a recovery
            self.recoveries[-1].recover_s = arrived - self._lost_at
        self._lost_at = None
        self.meter.answered(sent, message, arrived, down_bytes)
        try:
            verdict = verdict_from_proto(message)
        except ValueError as exc:
            raise VerifierError(f"malformed verdict from the cloud: {exc}") from exc
        return Received(verdict, CloudTiming(message.server_us * 1e-6, message.forward_us * 1e-6, message.forward_rows))

    def abandon(self) -> None:
        """Drop the stream now without a Close, as an edge that vanished would (the cloud parks the
        session until its TTL); for soaks and tests. ``close`` afterwards only releases the channel."""
        self._stream.abandon()

    def measured_link(self) -> LinkHint | None:
        """What this session measured of the link, for the next session over it to start from (``edge
        serve``, which opens its stream with the request): the median round trip of its verdicts, the
        cloud's time taken out, and what its stream's headers said. None: no verdict was timed."""
        if not self.meter.rtt_samples_s:
            return None
        return LinkHint(self.meter.rtt_ms * 1e-3, self._cloud_hints)

    def close(self) -> None:
        # After the final verdict, Close tells the cloud it arrived (until then the cloud keeps
        # the finished session, in case the link broke on it). Without it, the session stays
        # parked for the next turn of a conversation.
        if not self.keep_session and self._stream.used:  # (a stream never used has no session)
            self._stream.send(pb.EdgeFrame(close=pb.Close()))
        self._stream.close()
        if self._owns_channel:
            self._channel.close()

    # -- sessions ----------------------------------------------------------
    def _open_session(self, committed: Sequence[int]) -> Resumption:
        """Open a new session on ``committed`` (the prompt, or after a lost session everything
        committed so far), its first position answered at once."""
        if not self._stream.is_fresh():
            self._restart_call()
        reopening = bool(self.resume_ticket)
        started = time.perf_counter()
        self._stream.send(pb.EdgeFrame(open=self._open_message(committed, len(committed) - self._request.prompt_len)))
        self.meter.prompt_tokens += len(committed)
        head_start = self._send_behind_open(len(committed) + 1)
        opened = self._opened()
        self._forwards_offset = self.forwards if reopening else 0
        self.forwards = self._forwards_offset + opened.forwards
        log.info(
            "session %s opened at %s (blocks up to %d, %d in flight)",
            self.session_id, self.endpoint.address, opened.max_draft_len, opened.max_blocks_in_flight,
        )
        if self._first_verdict is not None:  # as if an empty block went up with the Open
            self._in_flight.appendleft(SentBlock(started, len(committed), 0, 0))
        return Resumption(self._terms(opened, self._behind_open.early_sent, head_start), epoch=0, missed=[],
                          reopened=reopening)

    def _open_message(self, tokens: Sequence[int], generated: int, **fields) -> pb.Open:
        """``edge.opening.open_message`` for this session."""
        return open_message(self.endpoint, self._request, tokens, generated, **fields)

    def _extend_session(self, prompt: Sequence[int]) -> Resumption:
        """Continue the conversation's session: keep the longest prefix it shares with ``prompt``
        (at least the last prompt token is sent), append the rest. A session the cloud no longer
        has is opened anew on the whole prompt."""
        ticket, held = self.options.continue_from
        keep = common_prefix_length(held, prompt[:-1])
        if keep == 0:  # nothing shared: a new session
            return self._open_session(prompt)
        if not self._stream.is_fresh():
            self._restart_call()
        started = time.perf_counter()
        self._stream.send(pb.EdgeFrame(open=self._open_message(prompt[keep:], 0, resume_ticket=ticket,
                                                               committed_length=keep, extend=True)))
        head_start = self._send_behind_open(len(prompt) + 1)
        try:
            opened = self._opened()
        except VerifierError as exc:
            if isinstance(exc.__cause__, grpc.RpcError) and exc.__cause__.code() == grpc.StatusCode.NOT_FOUND:
                log.info("the conversation's session is gone from the cloud; opening a new one")
                self.resume_ticket = b""
                self._restart_call()
                return self._open_session(prompt)
            raise
        self.meter.prompt_tokens += len(prompt) - keep
        # The session's count spans every turn; this turn's starts with the prefill just run.
        self._forwards_offset = 1 - opened.forwards
        self.forwards = 1
        log.info("session %s continued: %d tokens kept, %d sent", self.session_id, keep, len(prompt) - keep)
        if self._first_verdict is not None:
            self._in_flight.appendleft(SentBlock(started, len(prompt), 0, 0))
        return Resumption(self._terms(opened, self._behind_open.early_sent, head_start), epoch=0, missed=[])

    def _reattach(self, committed: Sequence[int]) -> Resumption:
        """Take our session over on the current stream; the cloud says what we missed, then answers
        the next position unasked (as after an Open)."""
        started = time.perf_counter()
        self._stream.send(pb.EdgeFrame(open=pb.Open(resume_ticket=self.resume_ticket, committed_length=len(committed),
                                                    first_token=True)))
        try:
            # No prefill, but the first verdict may need a forward, queued behind other sessions'.
            opened = self._opened(timeout_s=self.options.verdict_timeout_s)
        except VerifierError as exc:
            if isinstance(exc.__cause__, grpc.RpcError) and exc.__cause__.code() == grpc.StatusCode.NOT_FOUND:
                raise _SessionGone() from exc
            raise
        try:
            missed = codec.decode_tokens(
                opened.committed_tail, opened.committed_tail_compressed, self.endpoint.vocab_size,
                max_tokens=self._request.max_new_tokens,
            ).tolist()
        except ValueError as exc:
            raise VerifierError(f"malformed resume answer from the cloud: {exc}") from exc
        if opened.committed_length != len(committed) + len(missed):
            raise VerifierError(
                f"the cloud resumed at {opened.committed_length} committed tokens with {len(missed)} we missed, "
                f"but we hold {len(committed)}"
            )
        self.forwards = self._forwards_offset + opened.forwards  # the session's count so far
        if self._first_verdict is not None:
            self._in_flight.appendleft(SentBlock(started, opened.committed_length, 0, 0))
        return Resumption(
            self._terms(opened),
            epoch=opened.epoch,
            missed=missed,
            stop_reason=stop_reason_from_proto(opened.stop_reason),
        )

    def _opened(self, timeout_s: float | None = None) -> pb.Opened:
        try:
            opened = self._receive("opened", timeout_s).opened
        finally:
            self._behind_open.opened()  # an early block not sent by now stays unsent (on any stream)
        self.resume_ticket = opened.resume_ticket
        # The answer to the first position (Open.first_token), which ``receive`` returns first.
        self._first_verdict = opened.first_verdict if opened.HasField("first_verdict") else None
        self.served_by = ServedBy(opened.replica, opened.target_fingerprint)
        self._cloud_hints = StreamHints.from_metadata(self._stream.headers())
        if opened.vocab_size != self.endpoint.vocab_size:
            raise VerifierError(f"cloud vocabulary has {opened.vocab_size} tokens, ours {self.endpoint.vocab_size}")
        self.endpoint.check_target(opened.target_fingerprint)
        return opened

    def _send_behind_open(self, start_position: int) -> int:
        """With an Open on its way: the early block or head start ``open`` was given, for the positions
        from ``start_position`` (``edge.behind_the_open``); returns how many head-start blocks went."""
        self._behind_open.send_early_block(start_position, self._send)
        return self._behind_open.send_head_start(start_position, self._send)

    def _terms(self, opened: pb.Opened, early: SentBlock | None = None, head_start: int = 0) -> SessionTerms:
        """The session's terms (``edge.opening.session_terms``); ``early``: a block sent before the Opened,
        which is no longer in flight when it does not stand (the verifier drops it unanswered)."""
        terms = session_terms(opened, self._request, None if early is None else early.drafts, head_start)
        if early is not None and not terms.kept_early_block and early in self._in_flight:
            self._in_flight.remove(early)
        return terms

    # -- the stream ----------------------------------------------------------
    def _restart_call(self) -> None:
        """A fresh Decode stream; what was in flight on the old one is forgotten."""
        self._in_flight.clear()
        self._first_verdict = None
        self._stream.restart(self.served_by.replica)  # a resume names the session's replica, for a proxy that routes by it

    def _receive(self, kind: str, timeout_s: float | None = None) -> pb.CloudFrame:
        try:
            return self._stream.receive(kind, timeout_s or self.options.verdict_timeout_s)
        except LinkLost as error:
            raise self._lost(error) from error.__cause__

    def _lost(self, error: LinkLost) -> VerifierError:
        """``error`` when the session may be resumed; a final error when the budget is 0."""
        if self._lost_at is None:
            self._lost_at = time.perf_counter()
        if self.options.outage_budget_s <= 0:
            return VerifierError(f"{error} (resuming is off: --outage-budget 0)")
        return error
