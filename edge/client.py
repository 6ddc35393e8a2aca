"""The edge's side of the wire: ``VerifierConnection`` over one gRPC ``Decode`` stream.

Synchronous to the decode loop; a reader thread moves cloud frames into a
queue so that every wait has a deadline. Counts every byte of every gRPC
message each way (``shared.wire.framed_size``), the round-trip time net of
the cloud's own processing (the verdict's ``server_us``), and keeps the
forward count the cloud reports. A bearer token travels as call credentials,
only over TLS or to a loopback address.

Resilience: a stream that breaks (or a cloud that stays silent past the
verdict timeout) raises ``LinkLost``; ``resume`` then reattaches the session
by its ticket on a new stream, or reopens it on the committed tokens when the
cloud lost it (a restart, the TTL). Attempts are spaced by tenacity's
exponential backoff with jitter, and gRPC's own reconnect backoff paces the
channel underneath, until ``outage_budget_s`` runs out. Each recovery is
recorded (``recoveries``).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import statistics
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from tenacity import Retrying, before_sleep_log, retry_if_exception_type, stop_after_delay, wait_exponential_jitter

from edge.decode_loop import LinkLost, Resumption, SessionTerms, VerifierError
from edge.drafter import DraftBlock, common_prefix_length
from edge.report import BlockTiming, Recovery
from protos import splitspec_pb2 as pb
from protos import splitspec_pb2_grpc as pb_grpc
from shared import codec
from shared.params import SamplingParams
from shared.verdict import StopReason, Verdict
from shared.wire import (
    CHANNEL_OPTIONS,
    REPLICA_HEADER,
    is_loopback,
    message_wire_bytes,
    sampling_to_proto,
    session_id_of,
    stop_reason_from_proto,
    verdict_from_proto,
)

__all__ = ["GrpcVerifier", "VerifierError", "LinkLost", "make_channel", "CloudOnlyResult", "cloud_only_generate"]

log = logging.getLogger(__name__)

_END = object()
# ``connect(stream=True)``: how long to wait for the cloud to answer a new stream's headers, and how
# long an unused stream is kept for the Open (below the cloud's default --open-timeout of 30 s).
_STREAM_ANSWER_S = 2.0
_STREAM_MAX_IDLE_S = 20.0

_BAD_INPUT = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.OUT_OF_RANGE}
# Statuses of a stream that broke rather than was refused: the session can be resumed. INTERNAL is
# what HTTP/2 reports for a connection torn mid-frame; ABORTED, a session another stream took over.
_TRANSIENT = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.INTERNAL,
}


@dataclass(eq=False)  # compared by identity: the early block is found again in the queue
class _Sent:
    """A block sent and not yet answered."""

    at: float  # perf_counter at send
    start_position: int
    drafts: int
    up_bytes: int  # its Draft frame on the wire


class _SessionGone(Exception):
    """The cloud has no session for our ticket (restarted, expired, another replica)."""


def make_channel(address: str, root_certificates: bytes | None = None, auth_token: str | None = None) -> grpc.Channel:
    """A channel to the verifier; with ``auth_token``, every call carries it as a bearer token.

    gRPC sends call credentials only over a secure channel: TLS when
    ``root_certificates`` is given, else local credentials, which hold only for
    a loopback address. A token for a remote address without TLS is refused
    (``ValueError``) rather than sent in cleartext.
    """
    if root_certificates is not None:
        credentials = grpc.ssl_channel_credentials(root_certificates)
    elif auth_token:
        if not is_loopback(address):
            raise ValueError(
                f"refusing to send the bearer token in cleartext to {address}: connect with TLS (--tls-ca) "
                "or to a loopback address"
            )
        credentials = grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP)
    else:
        return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    if auth_token:
        credentials = grpc.composite_channel_credentials(credentials, grpc.access_token_call_credentials(auth_token))
    return grpc.secure_channel(address, credentials, options=CHANNEL_OPTIONS)


# Channels that were connected once. A later connect on one (``edge serve``'s kept channel) does not
# wait again: a wait subscribes to the channel's connectivity, and a second subscription while
# gRPC's poller thread lives (0.2 s after the last) leaves it a connect attempt to make, which,
# after a close, fails in that thread ("Channel closed!"). The calls on a channel that lost its
# connection since fail and end as a lost link does.
_CONNECTED_CHANNELS: weakref.WeakSet = weakref.WeakSet()


def _wait_ready(channel: grpc.Channel, address: str, timeout_s: float) -> None:
    if channel in _CONNECTED_CHANNELS:
        return
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout_s)
    except grpc.FutureTimeoutError as exc:
        channel.close()
        raise VerifierError(f"cloud unreachable at {address} (no connection within {timeout_s:.0f}s)") from exc
    _CONNECTED_CHANNELS.add(channel)


def describe_rpc_error(error: grpc.RpcError) -> str:
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else str(error)
    return f"{code.name if code else 'ERROR'}: {details}"


class GrpcVerifier:
    """One generation session with a remote verifier. Use once: open, send/receive..., close."""

    def __init__(
        self,
        address: str,
        *,
        vocab_size: int,
        fingerprint: bytes,
        auth_token: str | None = None,
        root_certificates: bytes | None = None,
        connect_timeout_s: float = 10.0,
        verdict_timeout_s: float = 120.0,
        outage_budget_s: float = 30.0,
        channel: grpc.Channel | None = None,
        keep_session: bool = False,
        continue_from: tuple[bytes, Sequence[int]] | None = None,
    ) -> None:
        """``channel``: an open channel to reuse across sessions (the caller closes it, and gives it
        the credentials: ``make_channel``); default: our own, from the arguments here.
        ``outage_budget_s``: how long a broken link may take to come back (0: a cut ends the session).
        ``keep_session``: ``close`` leaves the cloud session parked (a conversation's next turn
        continues it) instead of ending it. ``continue_from``: (ticket, every token the session
        holds) of such a session: ``open`` extends it, sending only what the new prompt adds."""
        if channel is not None and (auth_token or root_certificates):
            raise ValueError("pass auth_token/root_certificates to make_channel for a shared channel, not here")
        self.address = address
        self.vocab_size = vocab_size
        self.fingerprint = fingerprint
        self.connect_timeout_s = connect_timeout_s
        self.verdict_timeout_s = verdict_timeout_s
        self.outage_budget_s = outage_budget_s
        self.keep_session = keep_session
        self._continue_from = continue_from
        self.prompt_tokens_sent = 0  # prompt tokens this session's Opens uploaded
        self.open_bytes = 0  # framed bytes of those Opens (all of them: first, resumes, reopens)
        self._owns_channel = channel is None
        self._channel = channel if channel is not None else make_channel(address, root_certificates, auth_token)
        self._requests: queue.Queue = queue.Queue()
        self._responses: queue.Queue = queue.Queue()
        self._call = None
        self._call_started: float | None = None  # monotonic start of the current stream while it has sent nothing
        self._reader: threading.Thread | None = None
        self._params = SamplingParams()
        self._prompt_len = 0
        self._max_new_tokens = 0
        self._max_draft_len = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self.rtt_samples_s: list[float] = []
        self.block_log: list[BlockTiming] = []  # [blocks verified]
        self.recoveries: list[Recovery] = []  # [broken streams recovered from]
        # Target forwards of this generation, prefill included: the cloud's count for the session
        # plus an offset (after a reopen, the lost session's as last reported; on a continued
        # conversation, minus the earlier turns').
        self.forwards = 0
        self._forwards_offset = 0
        self.last_cloud_s = 0.0  # the cloud's time on the last verdict (server_us)
        self.last_forward_s = 0.0  # ... the forward's alone (forward_us; 0: none, or a cloud that does not say)
        self.open_s = 0.0  # Open sent -> Opened received (prefill included)
        self.first_token_cloud_s = 0.0  # the cloud's time to the first token, prefill included (0: not answered with the Opened)
        self._connected = False
        self.session_id = ""
        self.resume_ticket = b""
        self.replica = ""  # the verifier replica serving the session (Opened)
        self._lost_at: float | None = None  # when the stream broke, until the first verdict after it
        # Blocks not yet answered, oldest first: each gets exactly one verdict, in order.
        self._in_flight: deque[_Sent] = deque()
        self._first_verdict: pb.Verdict | None = None  # the Opened's answer to the first position, not yet received
        self._early_block = None  # while opening: the caller's early block (``open``), a Future
        self._early_lock = threading.Lock()
        self._early_sent: _Sent | None = None  # the early block, once sent
        self._early_attempt: object | None = None  # the Open whose early block may still go (until its Opened)

    # -- VerifierConnection ------------------------------------------------------
    def connect(self, *, stream: bool = False) -> None:
        """Establish the channel (TCP and HTTP/2 setup) now rather than on ``open``.

        ``stream``: also start the Decode stream and wait (at most ``_STREAM_ANSWER_S``) for the
        cloud to answer its headers, so that ``open`` sends the Open alone: gRPC writes a stream's
        headers apart from its first message, and on a thin link that extra segment delays the
        first token (about 10 ms at 50 kbit/s). A stream unused for ``_STREAM_MAX_IDLE_S`` is
        replaced on ``open`` (the cloud ends one that sends nothing for ``--open-timeout``)."""
        if not self._connected:
            _wait_ready(self._channel, self.address, self.connect_timeout_s)
            self._connected = True
        if stream and not self._call_is_fresh():
            self._restart_call()
            answered = threading.Event()
            call = self._call

            def wait_for_headers() -> None:  # (returns on the headers or when the call ends)
                with contextlib.suppress(grpc.RpcError):
                    call.initial_metadata()
                answered.set()

            threading.Thread(target=wait_for_headers, name="edge-stream-headers", daemon=True).start()
            if not answered.wait(_STREAM_ANSWER_S):  # a verifier that answers the headers with its Opened only
                log.debug("the cloud did not answer the stream's headers within %.0f s; going on", _STREAM_ANSWER_S)

    def open(self, prompt: Sequence[int], params: SamplingParams, max_new_tokens: int, max_draft_len: int,
             early_block=None) -> SessionTerms:
        self.connect()
        self._params, self._prompt_len = params, len(prompt)
        self._max_new_tokens, self._max_draft_len = max_new_tokens, max_draft_len
        self._early_block = early_block
        started = time.perf_counter()
        try:
            if self._continue_from is not None:
                terms = self._extend_session(prompt).terms
            else:
                terms = self._open_session(prompt).terms
        except LinkLost:  # broken before the Opened came: open again, as after any cut (no early block)
            self._lost_at = started
            terms = self.resume(prompt).terms
        finally:
            self._early_block = None
        self.open_s = time.perf_counter() - started
        if self._first_verdict is not None:
            self.first_token_cloud_s = self._first_verdict.server_us * 1e-6
        return terms

    def resume(self, committed: Sequence[int]) -> Resumption:
        if self._lost_at is None:
            self._lost_at = time.perf_counter()
        lost_at, up_before, attempts = self._lost_at, self.bytes_up, 0
        cause = ""

        def attempt() -> Resumption:
            nonlocal attempts
            attempts += 1
            self._restart_call()  # fails fast (UNAVAILABLE) while the channel cannot connect
            if self.resume_ticket:
                try:
                    return self._reattach(committed)
                except _SessionGone:
                    log.info("session %s is gone from the cloud; reopening on %d committed tokens",
                             self.session_id, len(committed))
                    self._restart_call()  # the cloud ended that stream
            return self._open_session(committed)

        retrying = Retrying(
            stop=stop_after_delay(self.outage_budget_s),
            wait=wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.05),
            retry=retry_if_exception_type(LinkLost),
            before_sleep=before_sleep_log(log, logging.WARNING),
            reraise=True,
        )
        try:
            for trial in retrying:
                with trial:
                    resumed = attempt()
        except LinkLost as exc:
            cause = str(exc)
            raise VerifierError(
                f"lost the cloud at {self.address} and could not resume within the outage budget of "
                f"{self.outage_budget_s:g}s ({attempts} attempts): {cause}"
            ) from exc
        reconnect_s = time.perf_counter() - lost_at
        self.recoveries.append(
            Recovery(
                reconnect_s=reconnect_s,
                attempts=attempts,
                reopened=resumed.reopened,
                missed_tokens=len(resumed.missed),
                up_bytes=self.bytes_up - up_before,
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
             before_opened: bool = False) -> None:
        params = self._params
        encoded = codec.encode_draft(
            block.tokens, self.vocab_size, block.q, draft_top_k=params.draft_top_k if block.q is not None else None
        )
        branches = []
        for at, tokens in block.branches:
            packed = codec.encode_tokens(tokens, self.vocab_size)
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
            )
        )
        self._in_flight.append(_Sent(time.perf_counter(), start_position, len(block.tokens), message_wire_bytes(frame)))
        self._send(frame)

    def receive(self) -> Verdict:
        if self._first_verdict is not None:  # it came inside the Opened (its bytes were counted there)
            message, self._first_verdict = self._first_verdict, None
            return self._take_verdict(message, message.ByteSize() + 2)
        reply = self._receive("verdict")
        return self._take_verdict(reply.verdict, message_wire_bytes(reply))

    def ready(self) -> bool:
        return self._first_verdict is not None or not self._responses.empty()

    def _take_verdict(self, message: pb.Verdict, down_bytes: int) -> Verdict:
        """Account for one verdict (``down_bytes``: what it cost the downlink) and decode it."""
        arrived = time.perf_counter()
        self.last_cloud_s = message.server_us * 1e-6
        self.last_forward_s = message.forward_us * 1e-6
        if message.done:  # the total rides on the final verdict only
            self.forwards = self._forwards_offset + message.forwards
        if not self._in_flight:
            raise VerifierError(f"verdict for a block never sent (epoch {message.epoch}, position {message.start_position})")
        sent = self._in_flight.popleft()
        if self._lost_at is not None and self.recoveries:  # the first verdict after a recovery
            self.recoveries[-1].recover_s = arrived - self._lost_at
        self._lost_at = None
        self.rtt_samples_s.append(max(arrived - sent.at - message.server_us * 1e-6, 0.0))
        self._check_tokens(message)
        if message.stale:  # answered without its drafts: a token decoded (after rebased drafts), or no forward
            forward_tokens = message.rebased_verified + 1 if message.HasField("token") or message.rebased else 0
        elif not sent.drafts:  # an empty block: one token, wherever it was asked for
            forward_tokens = 1
        else:  # drafts before the verdict's start were already committed: not in the forward
            forward_tokens = sent.drafts + 1 - max(message.start_position - sent.start_position, 0)
        if forward_tokens:
            self.block_log.append(
                BlockTiming(forward_tokens=forward_tokens, cloud_s=message.server_us * 1e-6, up_bytes=sent.up_bytes,
                            down_bytes=down_bytes)
            )
        try:
            return verdict_from_proto(message)
        except ValueError as exc:
            raise VerifierError(f"malformed verdict from the cloud: {exc}") from exc

    def _check_tokens(self, message: pb.Verdict) -> None:
        """Refuse a verdict's token ids before anything is taken from it: ids outside the vocabulary,
        more rebased drafts than it verified or than a block may hold, rebased drafts with neither a
        token after them nor the end (whether it answers the block sent is the loop's question)."""
        rebased = message.rebased
        if len(rebased) > message.rebased_verified or message.rebased_verified > self._max_draft_len:
            raise VerifierError(f"malformed verdict from the cloud: {len(rebased)} rebased drafts of "
                                f"{message.rebased_verified} verified, at most {self._max_draft_len}")
        if rebased and not message.HasField("token") and not message.done:
            raise VerifierError("malformed verdict from the cloud: rebased drafts with no token after them")
        if any(token >= self.vocab_size for token in rebased) or message.token >= self.vocab_size:
            raise VerifierError(f"malformed verdict from the cloud: a token id outside the vocabulary of {self.vocab_size}")

    def abandon(self) -> None:
        """Drop the stream now without a Close, as an edge that vanished would (the cloud parks the
        session until its TTL); for soaks and tests. ``close`` afterwards only releases the channel."""
        if self._call is not None:
            self._requests.put(_END)
            self._call.cancel()
            self._call = None

    def close(self) -> None:
        if self._call is not None:
            # After the final verdict, Close tells the cloud it arrived (until then the cloud keeps
            # the finished session, in case the link broke on it). Without it, the session stays
            # parked for the next turn of a conversation.
            if not self.keep_session and self._call_started is None:  # (a stream never used has no session)
                self._send(pb.EdgeFrame(close=pb.Close()))
            self._requests.put(_END)
            if self._reader:
                self._reader.join(timeout=5)
            self._call.cancel()
            self._call = None
        if self._owns_channel:
            self._channel.close()

    # -- measurements ------------------------------------------------------
    @property
    def rtt_ms(self) -> float:
        """Median round trip net of the cloud's processing, in ms (0 before any block)."""
        return 1e3 * statistics.median(self.rtt_samples_s) if self.rtt_samples_s else 0.0

    # -- sessions ----------------------------------------------------------
    def _open_session(self, committed: Sequence[int]) -> Resumption:
        """Open a new session on ``committed`` (the prompt, or after a lost session everything
        committed so far), its first position answered at once."""
        if not self._call_is_fresh():
            self._restart_call()
        reopening = bool(self.resume_ticket)
        started = time.perf_counter()
        self._send(pb.EdgeFrame(open=self._open_message(committed, len(committed) - self._prompt_len)))
        self.prompt_tokens_sent += len(committed)
        self._send_early_block(len(committed) + 1)
        opened = self._opened()
        self._forwards_offset = self.forwards if reopening else 0
        self.forwards = self._forwards_offset + opened.forwards
        log.info(
            "session %s opened at %s (blocks up to %d, %d in flight)",
            self.session_id, self.address, opened.max_draft_len, opened.max_blocks_in_flight,
        )
        if self._first_verdict is not None:
            self._in_flight.appendleft(_Sent(started, len(committed), 0, 0))  # as if an empty block went up with the Open
        return Resumption(self._terms(opened, self._early_sent), epoch=0, missed=[], reopened=reopening)

    def _open_message(self, tokens: Sequence[int], generated: int, **fields) -> pb.Open:
        """An Open carrying ``tokens`` as its prompt, ``generated`` tokens of the budget spent."""
        encoded = codec.encode_tokens(tokens, self.vocab_size)
        return pb.Open(
            vocab_fingerprint=self.fingerprint,
            vocab_size=self.vocab_size,
            sampling=sampling_to_proto(self._params),
            prompt=encoded.data,
            prompt_compressed=encoded.compressed,
            max_new_tokens=self._max_new_tokens - generated,
            max_draft_len=self._max_draft_len,
            first_token=True,
            takes_rebased=True,
            **fields,
        )

    def _extend_session(self, prompt: Sequence[int]) -> Resumption:
        """Continue the conversation's session: keep the longest prefix it shares with ``prompt``
        (at least the last prompt token is sent), append the rest. A session the cloud no longer
        has is opened anew on the whole prompt."""
        ticket, held = self._continue_from
        keep = common_prefix_length(held, prompt[:-1])
        if keep == 0:  # nothing shared: a new session
            return self._open_session(prompt)
        if not self._call_is_fresh():
            self._restart_call()
        started = time.perf_counter()
        self._send(pb.EdgeFrame(open=self._open_message(prompt[keep:], 0, resume_ticket=ticket,
                                                        committed_length=keep, extend=True)))
        self._send_early_block(len(prompt) + 1)
        try:
            opened = self._opened()
        except VerifierError as exc:
            if isinstance(exc.__cause__, grpc.RpcError) and exc.__cause__.code() == grpc.StatusCode.NOT_FOUND:
                log.info("the conversation's session is gone from the cloud; opening a new one")
                self.resume_ticket = b""
                self._restart_call()
                return self._open_session(prompt)
            raise
        self.prompt_tokens_sent += len(prompt) - keep
        # The session's count spans every turn; this turn's starts with the prefill just run.
        self._forwards_offset = 1 - opened.forwards
        self.forwards = 1
        log.info("session %s continued: %d tokens kept, %d sent", self.session_id, keep, len(prompt) - keep)
        if self._first_verdict is not None:
            self._in_flight.appendleft(_Sent(started, len(prompt), 0, 0))
        return Resumption(self._terms(opened, self._early_sent), epoch=0, missed=[])

    def _reattach(self, committed: Sequence[int]) -> Resumption:
        """Take our session over on the current stream; the cloud says what we missed, then answers
        the next position unasked (as after an Open)."""
        started = time.perf_counter()
        self._send(pb.EdgeFrame(open=pb.Open(resume_ticket=self.resume_ticket, committed_length=len(committed),
                                             first_token=True)))
        try:
            # No prefill, but the first verdict may need a forward, queued behind other sessions'.
            opened = self._opened(timeout_s=self.verdict_timeout_s)
        except VerifierError as exc:
            if isinstance(exc.__cause__, grpc.RpcError) and exc.__cause__.code() == grpc.StatusCode.NOT_FOUND:
                raise _SessionGone() from exc
            raise
        try:
            missed = codec.decode_tokens(
                opened.committed_tail, opened.committed_tail_compressed, self.vocab_size,
                max_tokens=self._max_new_tokens,
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
            self._in_flight.appendleft(_Sent(started, opened.committed_length, 0, 0))
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
            with self._early_lock:  # an early block not sent by now stays unsent (on any stream)
                self._early_attempt = None
        self.session_id, self.resume_ticket = session_id_of(opened.resume_ticket), opened.resume_ticket
        # The answer to the first position (Open.first_token), which ``receive`` returns first.
        self._first_verdict = opened.first_verdict if opened.HasField("first_verdict") else None
        self.replica = opened.replica
        if opened.vocab_size != self.vocab_size:
            raise VerifierError(f"cloud vocabulary has {opened.vocab_size} tokens, ours {self.vocab_size}")
        return opened

    def _send_early_block(self, start_position: int) -> None:
        """With the Open on its way: the caller's early block (``open``) goes out for
        ``start_position`` at epoch 0 as soon as it is drafted, if that is before the Opened
        arrives (``_opened`` says whether it went)."""
        future, self._early_block = self._early_block, None  # once: a retried Open goes without one
        attempt = object()
        with self._early_lock:
            self._early_sent, self._early_attempt = None, attempt if future is not None else None
        if future is None:
            return

        def ready(done) -> None:  # on the drafting thread (or here, when it is done already)
            made = None if done.cancelled() or done.exception() else done.result()
            with self._early_lock:
                if made and self._early_attempt is attempt:  # (this Open's, and its Opened not come yet)
                    block, more_follows = made
                    self.send(0, start_position, block, more_follows, before_opened=True)
                    self._early_sent = self._in_flight[-1]  # (nothing else is sent before the Opened)

        future.add_done_callback(ready)

    def _terms(self, opened: pb.Opened, early: _Sent | None = None) -> SessionTerms:
        """The session's terms; ``early``: a block sent before the Opened (the verifier drops it,
        unanswered, when it exceeds the session's draft length)."""
        max_draft_len = min(self._max_draft_len, opened.max_draft_len)
        kept = early is not None and early.drafts <= max_draft_len and opened.HasField("first_verdict")
        if early is not None and not kept and early in self._in_flight:
            self._in_flight.remove(early)
        # A verifier that predates pipelining sends no window: it takes one block at a time.
        return SessionTerms(
            max_draft_len,
            max(opened.max_blocks_in_flight, 1),
            answers_first_position=opened.HasField("first_verdict"),
            max_branches=opened.max_branches,
            kept_early_block=kept,
        )

    # -- internals ---------------------------------------------------------
    def _call_is_fresh(self) -> bool:
        """Whether the current Decode stream has sent nothing yet, is alive, and is young enough
        that the cloud is still waiting for its Open."""
        return (self._call is not None and self._call_started is not None and not self._call.done()
                and time.monotonic() - self._call_started < _STREAM_MAX_IDLE_S)

    def _restart_call(self) -> None:
        """A fresh Decode stream; the old one, if any, is cancelled and its queues dropped."""
        if self._call is not None:
            self._requests.put(_END)
            self._call.cancel()
        self._call_started = time.monotonic()  # (None once a frame has been sent on it)
        self._requests, self._responses = queue.Queue(), queue.Queue()
        self._in_flight.clear()
        self._first_verdict = None
        # A resume names the session's replica, for a proxy that routes by it (deploy/envoy.yaml).
        metadata = ((REPLICA_HEADER, self.replica),) if self.replica else None
        self._call = pb_grpc.VerifierStub(self._channel).Decode(iter(self._requests.get, _END), metadata=metadata)
        self._reader = threading.Thread(
            target=self._read_forever, args=(self._call, self._responses), name="edge-link-reader", daemon=True
        )
        self._reader.start()

    def _send(self, frame: pb.EdgeFrame) -> None:
        self._call_started = None  # the stream is in use
        size = message_wire_bytes(frame)
        self.bytes_up += size
        if frame.WhichOneof("kind") == "open":
            self.open_bytes += size
        self._requests.put(frame)

    @staticmethod
    def _read_forever(call, responses: queue.Queue) -> None:
        try:
            for message in call:
                responses.put(message)
            responses.put(_END)
        except grpc.RpcError as error:
            responses.put(error)

    def _receive(self, kind: str, timeout_s: float | None = None) -> pb.CloudFrame:
        timeout_s = timeout_s or self.verdict_timeout_s
        try:
            item = self._responses.get(timeout=timeout_s)
        except queue.Empty:
            self._call.cancel()
            raise self._lost(LinkLost(f"no {kind} from the cloud within {timeout_s:g}s")) from None
        if isinstance(item, grpc.RpcError):
            if item.code() in _TRANSIENT:
                raise self._lost(LinkLost(f"lost the cloud at {self.address}: {describe_rpc_error(item)}")) from item
            raise VerifierError(f"cloud ended the session: {describe_rpc_error(item)}", item.code() in _BAD_INPUT) from item
        if item is _END:
            raise self._lost(LinkLost(f"cloud closed the stream before sending the {kind}"))
        self.bytes_down += message_wire_bytes(item)
        if item.WhichOneof("kind") != kind:
            raise VerifierError(f"expected {kind} from the cloud, got {item.WhichOneof('kind')}")
        return item

    def _lost(self, error: LinkLost) -> VerifierError:
        """``error`` when the session may be resumed; a final error when the budget is 0."""
        if self._lost_at is None:
            self._lost_at = time.perf_counter()
        if self.outage_budget_s <= 0:
            return VerifierError(f"{error} (resuming is off: --outage-budget 0)")
        return error


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


def cloud_only_generate(
    address: str,
    prompt: Sequence[int],
    params: SamplingParams,
    *,
    vocab_size: int,
    fingerprint: bytes,
    max_new_tokens: int,
    auth_token: str | None = None,
    root_certificates: bytes | None = None,
    connect_timeout_s: float = 10.0,
    timeout_s: float = 600.0,
    on_tokens=None,
) -> CloudOnlyResult:
    """The baseline: the cloud decodes every token (``Generate``) and streams each one down."""
    channel = make_channel(address, root_certificates, auth_token)
    _wait_ready(channel, address, connect_timeout_s)
    encoded = codec.encode_tokens(prompt, vocab_size)
    request = pb.GenerateRequest(
        vocab_fingerprint=fingerprint,
        vocab_size=vocab_size,
        sampling=sampling_to_proto(params),
        prompt=encoded.data,
        prompt_compressed=encoded.compressed,
        max_new_tokens=max_new_tokens,
    )
    tokens: list[int] = []
    chunk_log: list[BlockTiming] = []
    bytes_down, ttft, stop, forwards = 0, 0.0, StopReason.NONE, 0
    started = time.perf_counter()
    try:
        for chunk in pb_grpc.VerifierStub(channel).Generate(request, timeout=timeout_s):
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
            f"cloud-only generation failed: {describe_rpc_error(error)}", error.code() in _BAD_INPUT
        ) from error
    except ValueError as exc:
        raise VerifierError(f"malformed chunk from the cloud: {exc}") from exc
    finally:
        channel.close()
    return CloudOnlyResult(
        tokens, stop, time.perf_counter() - started, ttft, message_wire_bytes(request), bytes_down, forwards, chunk_log
    )
