"""The handshake: a stream's Open (or a GenerateRequest) turned into a session it drives.

Contract. ``Handshake.attach`` answers a Decode stream's Open in one of three
ways: a new session (the prompt prefilled on the engine thread), a resume
(``resume_ticket``: the parked session, and what the edge missed), or a new
turn (``resume_ticket`` with ``extend``: the session cut back and extended).
It checks the vocabulary (``FAILED_PRECONDITION``), the request
(``INVALID_ARGUMENT``), that this verifier serves the Open's mode to this
client (``FAILED_PRECONDITION``: ``ServiceLimits.modes``, and rejection mode
only to the identities ``ServiceLimits.rejection_to`` grants it) and
room in the session table (``RESOURCE_EXHAUSTED``); an unknown ticket is
``NOT_FOUND``. Every refusal is an ``Abort`` of that stream alone, and a session a refused resume or turn held is released.
Sessions count against their owner, the stream's verified identity (``cloud.identity``);
an owner whose drafts are accepted next to never (``ClientLedger.capped``)
gets new sessions of ``ServiceLimits.capped_draft_len`` drafts per block at most,
whose stale blocks are answered without a forward.
It verifies no block and writes nothing to the stream (``cloud.block_stream``,
``cloud.servicer``).
"""

from __future__ import annotations

import logging
import secrets
from typing import NamedTuple

import grpc

from cloud.identity import granted
from cloud.open_rate import OpenRate
from cloud.service_part import ServicePart
from cloud.session import SessionPolicy, VerifierSession
from cloud.session_table import SessionEntry, TableFull
from cloud.stream_end import Abort
from protos import splitspec_pb2 as pb
from shared import codec
from shared.params import Mode, SamplingParams
from shared.vocab import describe_vocab
from shared.wire import REPLICA_HEADER, OpenRequest, parse_open_request, stop_reason_to_proto

__all__ = ["Attached", "Handshake", "tells_end"]

log = logging.getLogger(__name__)


class Attached(NamedTuple):
    """A stream's session after the handshake."""

    entry: SessionEntry
    stream: int  # the session's stream number this stream got: another resume may bump it meanwhile
    opened: pb.Opened  # the Opened so far: committed length, and for a resume what the edge missed
    answer_first: bool  # the first position is to be answered with the Opened


def tells_end(request: pb.Open) -> bool:
    """Whether the session's final verdict may come unasked (``Open.takes_unasked_end``, which rides with
    ``takes_ahead``: only tokens decoded ahead end a session with none of the edge's blocks waiting)."""
    return request.takes_ahead and request.takes_unasked_end


class Handshake(ServicePart):
    """Opens, resumes and extends sessions in ``table``, prefilling on ``scheduler``'s engine thread."""

    def __post_init__(self) -> None:
        self.replica = ""  # this replica's name, told to edges in Opened (their key to its MQTT load)
        self.opens = OpenRate(self.limits.opens_per_client_s, self.limits.open_burst_per_client)

    @property
    def max_branches(self) -> int:
        """Hedge branches a block may carry here (none where the engine cannot verify a tree)."""
        return self.limits.max_branches if self.engine.verifies_branches else 0

    # -- checks ------------------------------------------------------------
    def _check_vocab(self, vocab_size: int, fingerprint: bytes) -> None:
        engine = self.engine
        if vocab_size != engine.vocab_size or bytes(fingerprint) != engine.fingerprint:
            raise Abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "vocabulary mismatch: "
                + describe_vocab("the edge drafter", vocab_size, bytes(fingerprint))
                + " vs "
                + describe_vocab(f"the cloud target {engine.model_name}", engine.vocab_size, engine.fingerprint),
            )

    def parse_request(self, request) -> OpenRequest:
        """Validate what Open and GenerateRequest share (``shared.wire``), the vocabulary, and a rejection
        session's q̃ support against ``max_draft_top_k``."""
        self._check_vocab(request.vocab_size, request.vocab_fingerprint)
        try:
            parsed = parse_open_request(
                request,
                vocab_size=self.engine.vocab_size,
                max_prompt_tokens=self.limits.max_prompt_tokens,
                max_new_tokens=self.limits.max_new_tokens,
            )
        except ValueError as exc:
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        self._check_numerics(parsed)
        params, most = parsed.params, self.limits.max_draft_top_k
        if params.sends_q and params.draft_top_k > most:
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT,
                        f"a q̃ support of {params.draft_top_k} tokens exceeds this verifier's limit of {most} "
                        "(--max-draft-top-k)")
        return parsed

    def _check_numerics(self, opened: OpenRequest) -> None:
        """A reproducible session needs canonical shapes: a verifier in free shapes, or one whose device
        has no row-invariant product, refuses it rather than promise what it cannot keep."""
        if opened.params.reproducible and not self.engine.serves_reproducible:
            why = ("it runs free shapes (--shapes free)" if self.engine.shapes == "free"
                   else "this device's products are not row-invariant under any padding tried")
            raise Abort(grpc.StatusCode.FAILED_PRECONDITION,
                        f"this verifier cannot serve a reproducible session: {why}; ask without reproducible "
                        "(exact in distribution) or use a verifier in --shapes auto or canonical")

    def check_mode(self, params: SamplingParams, context) -> None:
        """Refuse an Open whose mode this verifier does not serve (to this client): ``FAILED_PRECONDITION``.
        The mode served is the one verification uses: temperature 0 is greedy in every mode."""
        mode = Mode.GREEDY if params.is_greedy else params.mode
        served = self.limits.modes
        if mode.value not in served:
            raise Abort(grpc.StatusCode.FAILED_PRECONDITION,
                        f"this verifier does not serve {mode.value} mode (it serves {', '.join(served)})")
        if mode is Mode.REJECTION and not granted(self.owner(context), self.limits.rejection_to):
            raise Abort(grpc.StatusCode.FAILED_PRECONDITION,
                        "this verifier serves rejection mode only to clients it grants it (--rejection-to); "
                        "greedy and coupled modes are lossless against any edge: ask for coupled")

    def _check_routing(self, context) -> None:
        """A resume or a next turn names the replica that holds its session; one that names another
        replica was misrouted (a proxy without affinity): counted, then answered as usual (the
        ticket is unknown here, so NOT_FOUND, and the edge reopens)."""
        named = str(dict(context.invocation_metadata() or ()).get(REPLICA_HEADER, ""))
        if named and self.replica and named != self.replica:
            self.metrics.misrouted.inc()
            log.info("a stream for replica %s reached replica %s", named, self.replica)

    def owner(self, context) -> str:
        """Whom a stream's sessions count against: its verified identity (``cloud.identity``)."""
        return self.identities.of(context)

    # -- sessions ----------------------------------------------------------
    def release(self, entry: SessionEntry | None, finished: bool) -> None:
        """Drop ``entry`` from the table (``finished``), else park it: resumable by its ticket."""
        if entry is None:
            return
        if finished:
            self.table.remove(entry)
        else:
            self.table.detach(entry)
        self.metrics.sessions_active.set(len(self.table))

    async def new_session(self, opened: OpenRequest, max_draft_len: int, owner: str, takes: pb.Open | None = None
                          ) -> SessionEntry:
        """``takes``: the edge's Open, for what its verdicts may carry (``Open.takes_rebased``,
        ``takes_proposals``, ``takes_ahead``, ``takes_unasked_end``); None: none of it (``Generate``)."""
        params, prompt, max_new_tokens = opened.params, opened.prompt, opened.max_new_tokens
        takes = takes if takes is not None else pb.Open()
        if not self.opens.take(owner):
            raise Abort(grpc.StatusCode.RESOURCE_EXHAUSTED, self.opens.refusal())
        try:
            # Refuse before spending a prefill on a session that cannot be kept.
            self.table.reserve(owner, len(prompt) + max_new_tokens)

            def open_session():  # (on the engine thread, where the ledger lives)
                capped = self.limits.capped_draft_len and self.scheduler.ledger.capped(owner)
                session = VerifierSession(
                    self.engine, prompt, params, max_new_tokens=max_new_tokens,
                    max_draft_len=min(max_draft_len, self.limits.capped_draft_len) if capped else max_draft_len,
                    policy=SessionPolicy(
                        max_branches=self.max_branches, decode_stale=self.limits.decode_stale and not capped,
                        rebase_stale=self.limits.rebase_stale and takes.takes_rebased, propose=takes.takes_proposals,
                        decode_ahead=takes.takes_ahead, tell_end=tells_end(takes),
                        audit_drafts=self.limits.audit_drafts, max_rows=self.limits.max_batch_rows,
                        coin_key=secrets.randbits(63) or 1),
                    prefill=False,
                )
                yield from session.prefill_steps()
                return session

            session = await self.scheduler.run(open_session)
            # Checks again: others may have opened during the prefill.
            entry = self.table.add(session, owner, len(prompt) + max_new_tokens)
        except TableFull as exc:
            raise Abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)) from exc
        except ValueError as exc:  # the session refused the request (e.g. longer than the target's context)
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        self.metrics.sessions_opened.inc()
        self.metrics.sessions_active.set(len(self.table))
        self.metrics.observe_open(forwards=session.forwards)
        return entry

    def _max_draft_len(self, request: pb.Open) -> int:
        return min(request.max_draft_len or self.limits.max_draft_len, self.limits.max_draft_len)

    # -- the three answers to an Open --------------------------------------
    async def attach(self, request: pb.Open, context) -> Attached:
        """The session ``request`` opens, resumes or extends, attached to this stream."""
        answer_first = request.first_token
        if request.resume_ticket:
            self._check_routing(context)
        if request.resume_ticket and request.extend:
            entry, stream = await self._extend(request, self.owner(context), context)
            opened = pb.Opened(committed_length=len(entry.session.tokens))
        elif request.resume_ticket:
            entry, stream, opened = await self._resume(request, self.owner(context))
            answer_first = answer_first and not entry.session.done
        else:
            entry = await self._open(request, self.owner(context), context)
            stream = entry.stream  # no await since the table added it
            opened = pb.Opened(committed_length=len(entry.session.tokens))
        return Attached(entry, stream, opened, answer_first)

    def service_fields(self, entry: SessionEntry) -> pb.Opened:
        """What every Opened tells the edge about the session and this replica."""
        session = entry.session
        return pb.Opened(
            resume_ticket=entry.ticket,
            vocab_size=self.engine.vocab_size,
            max_draft_len=session.draft_limit.current,
            forwards=session.forwards,
            max_blocks_in_flight=self.limits.max_blocks_in_flight,
            max_empty_blocks=self.limits.max_empty_blocks,
            max_branches=session.policy.max_branches,
            replica=self.replica,
            row_tile=self.engine.row_tile(session.params.reproducible),
            target_fingerprint=self.engine.weights_fingerprint,
        )

    async def _open(self, request: pb.Open, owner: str, context) -> SessionEntry:
        opened = self.parse_request(request)
        self.check_mode(opened.params, context)
        max_draft_len = self._max_draft_len(request)
        entry = await self.new_session(opened, max_draft_len, owner, request)
        params = opened.params
        log.info(
            "session %s opened: %d prompt tokens, mode %s, T=%.2f, D<=%d, max %d new",
            entry.session_id, len(opened.prompt), params.mode.value, params.temperature, max_draft_len,
            opened.max_new_tokens,
        )
        return entry

    async def _resume(self, request: pb.Open, owner: str) -> tuple[SessionEntry, int, pb.Opened]:
        """Attach the session of ``request.resume_ticket`` to this stream; the Opened tells the edge
        what it missed: the session's epoch and the tokens committed past ``committed_length``.

        The answer depends only on the session's state, so verdicts lost in a cut
        are recovered once, whatever the edge had in flight. The state is read on
        the engine thread, after any verify a dead stream had queued.
        """
        entry = self.table.resume(request.resume_ticket, owner)
        if entry is None:
            raise Abort(grpc.StatusCode.NOT_FOUND, "no resumable session for that ticket; reopen with the committed tokens as the prompt")
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
            session.ahead.clear()  # the Opened tells every token committed, those decoded ahead too
            return session.tokens[start:], session.epoch, committed

        try:
            tail, epoch, committed = await self.scheduler.run(missed, session)
        except LookupError as exc:
            self._release_if_held(entry, stream, True)
            raise Abort(grpc.StatusCode.NOT_FOUND, f"{exc}; reopen with the committed tokens as the prompt") from exc
        except ValueError as exc:
            self._release_if_held(entry, stream, True)
            raise Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        except BaseException:  # the stream went away meanwhile: park the session again
            self._release_if_held(entry, stream, False)
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

    async def _extend(self, request: pb.Open, owner: str, context) -> tuple[SessionEntry, int]:
        """A new turn on the session of ``request.resume_ticket``: cut back to ``committed_length``
        tokens, append the request's prompt, decode anew with its sampling and limits."""
        entry = self.table.resume(request.resume_ticket, owner)
        if entry is None:
            raise Abort(grpc.StatusCode.NOT_FOUND, "no session for that ticket; open a new one with the whole prompt")
        stream = entry.stream
        try:
            turn = self.parse_request(request)
            self.check_mode(turn.params, context)
            kept = request.committed_length
            if kept + len(turn.prompt) > self.limits.max_prompt_tokens:
                raise Abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"the conversation would hold {kept + len(turn.prompt)} prompt tokens, "
                    f"the limit is {self.limits.max_prompt_tokens}",
                )
            max_draft_len = self._max_draft_len(request)
            forwards_before = entry.session.forwards
            try:
                self.table.resize(entry, kept + len(turn.prompt) + turn.max_new_tokens)
            except TableFull as exc:
                raise Abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)) from exc
            def extend():  # (on the engine thread, where the ledger lives)
                capped = self.limits.capped_draft_len and self.scheduler.ledger.capped(owner)  # as for a new session
                limit = min(max_draft_len, self.limits.capped_draft_len) if capped else max_draft_len
                yield from entry.session.extend_steps(kept, turn.prompt, turn.params, max_new_tokens=turn.max_new_tokens,
                                                      max_draft_len=limit, propose=request.takes_proposals,
                                                      ahead=request.takes_ahead,
                                                      tell_end=tells_end(request))

            try:
                await self.scheduler.run(extend, entry.session)
            except ValueError as exc:
                raise Abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        except Abort:
            self._release_if_held(entry, stream, True)
            raise
        except BaseException:  # the stream went away meanwhile: park the session again
            self._release_if_held(entry, stream, False)
            raise
        self.metrics.observe_open(forwards=entry.session.forwards - forwards_before)
        log.info("session %s extended: kept %d tokens, appended %d, max %d new", entry.session_id,
                 kept, len(turn.prompt), turn.max_new_tokens)
        return entry, stream

    def _release_if_held(self, entry: SessionEntry, stream: int, finished: bool) -> None:
        """``release`` unless a newer stream drives the session now."""
        if entry.stream == stream:
            self.release(entry, finished)
