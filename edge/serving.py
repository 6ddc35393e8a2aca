"""The edge's generation service behind ``splitspec-edge serve``: one request at a time on the
device's drafter, split decoding against the cloud, conversations kept between requests, and
the drafter alone when the cloud is out of reach (``fallback="local"``); its health, the cloud's
state included (``edge.cloud_health``).

HTTP-free: ``edge.openai_api`` turns requests into ``Job``s and ``Outcome``s into OpenAI
responses. ``EdgeService.run`` blocks; the server runs it on a worker thread.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from edge.chat_template import ChatTemplate, chat_template_for
from edge.cloud_health import READY, CloudHealth, ServiceHealth, service_health
from edge.controller import Controller, controller_for
from edge.conversation import Conversation
from edge.decode_loop import GenerationResult, VerifierError, run_decode
from edge.drafter import common_prefix_length
from edge.endpoint import VerifierEndpoint
from edge.fallback import drafter_only_decode
from edge.grpc_verifier import GrpcVerifier
from edge.schedule import SpecConfig
from edge.text_stream import StopMatcher, TextDeltas
from edge.verifier_protocol import LinkHint
from shared.params import DEFAULT_DRAFT_LEN, DEFAULT_SCHEDULE, SamplingParams, window_for
from shared.stats import DecodeStats
from shared.verdict import StopReason

__all__ = ["ServeConfig", "Job", "Outcome", "EdgeService", "SPLIT", "DRAFTER_ONLY"]

log = logging.getLogger(__name__)

SPLIT = "split"  # drafted here, verified by the cloud: the target's output
DRAFTER_ONLY = "drafter-only"  # the offline fallback: the drafter's own output


@dataclass
class ServeConfig:
    cloud: str
    model_name: str
    auth_token: str | None = None
    root_certificates: bytes | None = None
    client_certificate: tuple[bytes, bytes] | None = field(default=None, repr=False)  # mutual TLS: (chain, key) PEM
    connect_timeout_s: float = 5.0
    verdict_timeout_s: float = 120.0
    outage_budget_s: float = 30.0
    draft_len: int = DEFAULT_DRAFT_LEN
    schedule: str = DEFAULT_SCHEDULE
    window: int | None = None  # None: DEFAULT_WINDOW pipelined, the link's (``drafting_window_for``) adaptive
    hedge_width: int = 0  # hedge branches a block (``edge run --hedge``)
    speculation_cache: bool = False  # draft a correction's next block before its verdict (``edge.speculation_cache``)
    fallback: str = "error"  # "local": answer from the drafter alone while the cloud is out of reach
    pinned_target: bytes | None = None  # the target weights every session must be served by (--pin-target)
    offline_retry_s: float = 10.0  # after a failed connection, requests go straight to the fallback this long
    max_conversations: int = 8  # conversations whose cloud sessions are kept between requests


@dataclass
class Job:
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    stop: list[str] = field(default_factory=list)  # stop strings (the request's and the chat format's)


@dataclass
class Outcome:
    text: str
    tokens: list[int]
    finish_reason: str  # "stop" or "length"
    served_by: str  # SPLIT or DRAFTER_ONLY
    prompt_tokens: int
    acceptance_length: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0
    cloud_forwards: int = 0
    prompt_tokens_sent: int = 0
    prompt_bytes_up: int = 0  # framed bytes of the Open frames that carried the prompt
    wall_s: float = 0.0
    ttft_s: float = 0.0
    decode: DecodeStats = field(default_factory=DecodeStats)  # the generation's counters (speculative steps too)


def _one_bos(ids: list[int]) -> list[int]:
    """``ids`` with BOS once, where the text carried one of its own too."""
    bos = ids[0] if ids else None
    return ids[1:] if len(ids) > 1 and ids[1] == bos else ids


class CloudUnavailable(RuntimeError):
    """The cloud is out of reach and the service has no fallback (HTTP 503)."""


class Cancelled(RuntimeError):
    """The request went away (the client disconnected)."""


class _Emitter:
    """Committed tokens -> text deltas for the caller, stopping at a stop string or stop token."""

    def __init__(self, detokenize, stops: Sequence[str], stop_ids: set[int], on_text: Callable[[str], None],
                 cancelled: threading.Event) -> None:
        self.deltas = TextDeltas(detokenize)
        self.matcher = StopMatcher(stops)
        self.stop_ids, self.on_text, self.cancelled = stop_ids, on_text, cancelled
        self.kept: list[int] = []  # tokens up to a stop token (excluded)
        self.stopped = False
        self.on_cancel: Callable[[], None] = lambda: None

    def __call__(self, tokens: list[int]) -> bool:
        if self.cancelled.is_set():
            self.on_cancel()
            raise Cancelled("the client went away")
        cut = next((i for i, t in enumerate(tokens) if t in self.stop_ids), None)
        if cut is not None:
            tokens, self.stopped = tokens[:cut], True
        self.kept.extend(tokens)
        text = self.matcher.feed(self.deltas.add(tokens)) if tokens else ""
        if self.stopped:
            text += self.matcher.flush()
        self.stopped = self.stopped or self.matcher.stopped
        if text:
            self.on_text(text)
        return self.stopped

    def finish(self) -> None:
        rest = self.matcher.flush()
        if rest:
            self.on_text(rest)


class EdgeService:
    """Generates for one request at a time: the caller serialises ``run`` (one drafter)."""

    def __init__(self, drafter, vocab, template: ChatTemplate, config: ServeConfig, stop_token_ids: set[int],
                 fleet=None) -> None:
        """``fleet``: an ``edge.telemetry.EdgeFleet`` to report to and take draft-length caps from."""
        self.drafter, self.vocab, self.template, self.config = drafter, vocab, template, config
        self.endpoint = VerifierEndpoint(
            config.cloud, vocab.size, vocab.fingerprint, root_certificates=config.root_certificates,
            auth_token=config.auth_token, client_certificate=config.client_certificate,
            connect_timeout_s=config.connect_timeout_s,
            pinned_target=config.pinned_target,
        )
        self.fleet = fleet
        self.last_replica = ""  # the replica that served the last split generation
        self.last_link: LinkHint | None = None  # what the last split generation measured of the link
        self.stop_token_ids = stop_token_ids  # end-of-turn tokens: the reply ends there
        self.conversations: list[Conversation] = []  # most recently used last
        self.offline_since: float | None = None
        self._channel = None  # to the cloud, kept across requests (``_cloud_channel``)
        self.cloud_health = CloudHealth(self.endpoint)  # its own channel: /health never waits behind a request

    @classmethod
    def for_drafter(cls, drafter, config: ServeConfig, chat_format: str | None = None, fleet=None) -> EdgeService:
        """The service for a ``LlamaDrafter``: its chat template (``chat_template_for``), and its
        end-of-sequence token plus any end-of-turn control token of the template as stop tokens."""
        template = chat_template_for(drafter.llm, chat_format)
        stop_ids = {drafter.llm.token_eos()}
        for stop in template.render([{"role": "user", "content": "x"}])[1]:
            ids = drafter.llm.tokenize(stop.strip().encode(), add_bos=False, special=True)
            if len(ids) == 1:  # an end-of-turn control token: the reply ends there
                stop_ids.add(ids[0])
        return cls(drafter, drafter.vocab, template, config, stop_ids, fleet)

    # -- prompts -------------------------------------------------------------
    def chat_prompt(self, messages: Sequence[dict]) -> tuple[list[int], list[str]]:
        """Token ids for a chat (the template applied), and the format's stop strings. Only the template's
        own markers are control tokens: a message's text is tokenized as text (a user who writes
        ``<end_of_turn>`` or ``</s>`` cannot end a turn or the conversation)."""
        parts, stops = self.template.render_parts(messages)
        return _one_bos(self.vocab.tokenize_parts(parts)), stops

    def text_prompt(self, text: str) -> list[int]:
        """Token ids for a text completion's prompt, tokenized as text (no control tokens); BOS once."""
        return _one_bos(self.vocab.tokenize(text, special=False))

    @property
    def context_size(self) -> int:
        return self.drafter.context_size

    # -- generation ----------------------------------------------------------
    def run(self, job: Job, on_text: Callable[[str], None], cancelled: threading.Event,
            on_start: Callable[[str], None] = lambda served_by: None) -> Outcome:
        """Generate for ``job``, calling ``on_text`` with each piece of text (blocking).

        ``on_start`` hears who serves the request (``SPLIT``, or ``DRAFTER_ONLY`` once it falls
        back) before any text. Raises ``CloudUnavailable`` (no fallback), ``VerifierError`` (the
        cloud refused or failed), ``Cancelled`` (``cancelled`` was set).
        """
        emitted: list[str] = []

        def emit(text: str) -> None:
            emitted.append(text)
            on_text(text)

        emitter = _Emitter(self.vocab.detokenize, job.stop, self.stop_token_ids, emit, cancelled)
        if not self.cloud_reachable and self.config.fallback == "local":
            on_start(DRAFTER_ONLY)
            return self._fallback(job, emitter, emitted)
        conversation = self._conversation_for(job.prompt)
        verifier = conversation.verifier(
            self.endpoint, channel=self._cloud_channel(), verdict_timeout_s=self.config.verdict_timeout_s,
            outage_budget_s=self.config.outage_budget_s,
        )
        emitter.on_cancel = lambda: setattr(verifier, "keep_session", False)  # the cloud ends the session
        params, draft_len = self._steered(job.params)
        # The stream opens with the request (no round trip is timed before the Open): the last session's
        # measurements stand in (before the first, ``measure_link``'s), so a long link's sessions start
        # with the cloud alone (``Controller.start``).
        verifier.link_hint = self.last_link
        try:
            verifier.connect()
            on_start(SPLIT)
            window, controller = self._schedule(draft_len)
            result = run_decode(
                self.drafter, verifier, job.prompt, params, max_new_tokens=job.max_tokens,
                spec=SpecConfig(draft_len, window=window, hedge_width=self.config.hedge_width, controller=controller,
                                speculation_cache=self.config.speculation_cache), on_tokens=emitter,
            )
        except Cancelled:
            self._drop(conversation)
            raise
        except VerifierError as exc:
            self._drop(conversation)
            if not exc.bad_input:  # the next request connects afresh, not after gRPC's reconnect backoff
                self.close()
                self.last_link = None  # (it may come back another way)
            if exc.bad_input or emitter.kept:  # the split already answered part of it: no mixing
                raise
            self.offline_since = time.monotonic()
            if self.config.fallback != "local":
                raise CloudUnavailable(str(exc)) from exc
            log.warning("cloud unreachable (%s): answering from the drafter alone", exc)
            on_start(DRAFTER_ONLY)
            return self._fallback(job, emitter, emitted)
        self.offline_since = None
        self.last_replica = verifier.served_by.replica
        self.last_link = verifier.measured_link() or self.last_link
        conversation.record(verifier, job.prompt, result.tokens)
        emitter.finish()
        outcome = self._outcome(job, result, emitter, emitted, SPLIT, verifier)
        self._report(outcome, result, params, draft_len, verifier)
        return outcome

    def measure_link(self, *, give_up_after_s: float = 60.0, every_s: float = 2.0) -> LinkHint | None:
        """Time a new stream's headers (a round trip with no cloud work in it) and read the cloud's hints,
        as ``edge run`` does before its Open, so that the first request on a long link can already start
        with the cloud alone (``Controller.start``). ``edge serve`` calls it once, beside the server.

        Contract: over a channel of its own (it may run while a request does) and a stream that carries
        no session. Tries every ``every_s`` while the cloud does not answer (it may still be loading),
        for at most ``give_up_after_s``, and stops as soon as a request has measured the link. Keeps its
        answer only where nothing was measured yet. Never raises; None: nothing measured."""
        deadline = time.monotonic() + give_up_after_s
        while self.last_link is None:
            try:
                hint = self._probe_link()
            except (VerifierError, ValueError) as exc:  # (ValueError: a token the endpoint will not send in clear)
                log.debug("link probe: %s", exc)
            else:  # (no hint where the headers came only with an Opened: nothing to time)
                if hint is not None and self.last_link is None:
                    self.last_link = hint
                    log.info("the link: round trip %.0f ms; %s", hint.round_trip_s * 1e3, hint.cloud)
                return hint
            if time.monotonic() + every_s > deadline:
                log.info("the link was not measured before the first request (the cloud did not answer)")
                return None
            time.sleep(every_s)
        return self.last_link

    def _probe_link(self) -> LinkHint | None:
        """One stream's headers, timed, over a channel of its own; raises as ``GrpcVerifier.connect``."""
        probe = GrpcVerifier(self.endpoint)
        try:
            probe.connect(stream=True)
            return probe.link_hint
        finally:
            probe.close()

    def _schedule(self, draft_len: int) -> tuple[int, Controller | None]:
        """Blocks in flight (the cap, for the adaptive schedule) and, for the adaptive schedule, a
        fresh controller for one generation, as ``edge run`` has."""
        window = window_for(self.config.schedule, self.config.window)
        return window, controller_for(self.config.schedule, draft_len, self.config.window)

    def _steered(self, params: SamplingParams) -> tuple[SamplingParams, int]:
        """The request's sampling and this generation's draft length, with the fleet's say:
        a commanded mode for sampled requests, draft length capped by a command and by the
        replica's suggestion."""
        draft_len = self.config.draft_len
        if self.fleet is None:
            return params, draft_len
        if self.fleet.mode is not None and not params.is_greedy:
            params = dataclasses.replace(params, mode=self.fleet.mode)
        return params, self.fleet.draft_len_cap(self.last_replica, draft_len)

    def _report(self, outcome: Outcome, result: GenerationResult, params: SamplingParams, draft_len: int,
                verifier) -> None:
        if self.fleet is None:
            return
        from edge.telemetry import GenerationSample

        self.fleet.observe(GenerationSample.of(
            result, mode=params.mode.value, draft_len=draft_len, served_by=outcome.served_by, verifier=verifier,
            window=window_for(self.config.schedule, self.config.window),
        ))

    def _fallback(self, job: Job, emitter: _Emitter, emitted: list[str]) -> Outcome:
        eos = {self.vocab.llm.token_eos()} | self.stop_token_ids
        result = drafter_only_decode(self.drafter, job.prompt, job.params, max_new_tokens=job.max_tokens,
                                     eos_ids=eos, on_tokens=emitter)
        emitter.finish()
        outcome = self._outcome(job, result, emitter, emitted, DRAFTER_ONLY, None)
        self._report(outcome, result, job.params, 0, None)
        return outcome

    def _outcome(self, job: Job, result: GenerationResult, emitter: _Emitter, emitted: list[str], served_by: str,
                 verifier) -> Outcome:
        finish = "length" if result.stop_reason is StopReason.LENGTH and not emitter.stopped else "stop"
        outcome = Outcome(
            text="".join(emitted), tokens=emitter.kept, finish_reason=finish, served_by=served_by,
            prompt_tokens=len(job.prompt), acceptance_length=result.stats.acceptance_length,
            wall_s=result.stats.wall_s, ttft_s=result.ttft_s, decode=result.stats,
        )
        if verifier is not None:
            outcome.bytes_up, outcome.bytes_down = verifier.bytes_up, verifier.bytes_down
            outcome.cloud_forwards, outcome.prompt_tokens_sent = verifier.forwards, verifier.prompt_tokens_sent
            outcome.prompt_bytes_up = verifier.open_bytes
        return outcome

    # -- state -----------------------------------------------------------------
    def _cloud_channel(self):
        """The channel to the cloud, opened on first use and kept: each request's session goes
        over the same connection (no TCP, TLS and HTTP/2 setup per request)."""
        if self._channel is None:
            self._channel = self.endpoint.open_channel()
        return self._channel

    def close(self) -> None:
        """Close the connections to the cloud (the next request, or health probe, opens a new one)."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        self.cloud_health.close()

    def health(self) -> ServiceHealth:
        """``/health``'s answer: the verifier's state (its health service, asked at most once a second)
        and what a request gets now. A verifier that answers again after a failed connection takes
        requests again at once (not ``offline_retry_s`` later)."""
        cloud = self.cloud_health.state()
        since = self.offline_since
        if cloud.state == READY and since is not None and cloud.checked_at > since:
            self.offline_since = None
        return service_health(cloud, self.config.fallback)

    @property
    def cloud_reachable(self) -> bool:
        """False for ``offline_retry_s`` after a failed connection (requests skip the cloud then)."""
        since = self.offline_since
        return since is None or time.monotonic() - since >= self.config.offline_retry_s

    def _conversation_for(self, prompt: list[int]) -> Conversation:
        """The kept conversation this prompt continues, else a new one. Every chat prompt shares its
        first few tokens (BOS, the turn header) with every other: a conversation is continued only
        when the prompt shares at least half of what its session holds."""
        def shared(conversation: Conversation) -> int:
            return common_prefix_length(conversation.tokens, prompt)

        best = max(self.conversations, key=shared, default=None)
        if best is None or shared(best) < max(2, len(best.tokens) // 2):
            best = Conversation()
            if len(self.conversations) >= self.config.max_conversations:
                self.conversations.pop(0)  # the least recently used; its cloud session expires by TTL
        else:
            self.conversations.remove(best)
        self.conversations.append(best)
        return best

    def _drop(self, conversation: Conversation) -> None:
        conversation.forget()
        if conversation in self.conversations:
            self.conversations.remove(conversation)
