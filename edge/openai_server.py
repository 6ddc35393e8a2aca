"""``splitspec-edge serve``: an OpenAI-compatible HTTP server on the device.

FastAPI routes over ``edge.serving.EdgeService``: ``POST /v1/chat/completions``
and ``POST /v1/completions`` (streaming as server-sent events, or whole),
``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus). Errors
use OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``) and
never carry a traceback. Server-sent events are written directly (``data:``
lines, ``data: [DONE]``): the stream is one-way and short-lived, so
sse-starlette's keep-alive pings and reconnection ids would add nothing.

One generation runs at a time (the device has one drafter); further requests
wait their turn, up to ``max_waiting``, then get 429. A client that goes away
mid-stream stops its generation, and its cloud session is closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from edge.decode_loop import VerifierError
from edge.serving import CloudUnavailable, EdgeService, Job, Outcome
from shared.params import DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P, Mode, SamplingParams

__all__ = ["create_app", "DEFAULT_MAX_TOKENS"]

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 256
SERVED_BY_HEADER = "X-Splitspec-Served-By"


# ---------------------------------------------------------------- requests


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")  # fields that change nothing are accepted as clients send them


class ContentPart(_Lenient):
    type: str
    text: str | None = None


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        if any(part.type != "text" for part in self.content):
            raise ApiError(400, "only text content parts are supported", "messages")
        return "".join(part.text or "" for part in self.content)


class StreamOptions(_Lenient):
    include_usage: bool = False


class _Sampling(_Lenient):
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)  # an extension clients of llama-server and vLLM send
    seed: int | None = Field(None, ge=0, lt=2**64)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    logprobs: bool | int | None = None
    best_of: int | None = None

    def refuse_unsupported(self) -> None:
        """A clear 400 for what we cannot honour (a value that changes nothing passes)."""
        if self.n != 1:
            raise ApiError(400, "n > 1 is not supported: one completion per request", "n")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise ApiError(400, f"{name} is not supported (only 0)", name)
        if self.logit_bias:
            raise ApiError(400, "logit_bias is not supported", "logit_bias")
        if self.logprobs:
            raise ApiError(400, "logprobs are not supported", "logprobs")
        if self.best_of not in (None, 1):
            raise ApiError(400, "best_of is not supported", "best_of")

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > 4:
            raise ApiError(400, "at most 4 stop sequences", "stop")
        return stops

    def sampling(self) -> SamplingParams:
        temperature = DEFAULT_TEMPERATURE if self.temperature is None else self.temperature
        return SamplingParams(
            mode=Mode.GREEDY if temperature == 0 else Mode.COUPLED,
            temperature=temperature,
            top_k=DEFAULT_TOP_K if self.top_k is None else self.top_k,
            top_p=DEFAULT_TOP_P if self.top_p is None else self.top_p,
            seed=secrets.randbelow(2**63) if self.seed is None else self.seed,
        )


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.tools or self.functions:
            raise ApiError(400, "tools and functions are not supported", "tools")
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            raise ApiError(400, "only the text response format is supported", "response_format")


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    echo: bool = False
    suffix: str | None = None

    def text(self) -> str:
        if isinstance(self.prompt, list):
            if len(self.prompt) != 1:
                raise ApiError(400, "one prompt per request", "prompt")
            return self.prompt[0]
        return self.prompt

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.echo or self.suffix:
            raise ApiError(400, "echo and suffix are not supported", "echo" if self.echo else "suffix")


class ApiError(Exception):
    """An error for the client, in OpenAI's shape."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
             429: "rate_limit_error", 503: "service_unavailable", 500: "server_error"}

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


# ---------------------------------------------------------------- the app


def create_app(service: EdgeService, *, api_key: str | None = None, max_waiting: int = 8) -> FastAPI:
    """The FastAPI app over ``service``; ``api_key`` set: /v1/* needs ``Authorization: Bearer <key>``."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

    app = FastAPI(title="splitspec edge", docs_url=None, redoc_url=None, openapi_url=None)
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edge-generate")
    slot = asyncio.Semaphore(1)
    waiting = {"n": 0}
    registry = CollectorRegistry()
    requests_total = Counter("splitspec_edge_requests", "HTTP requests", ["endpoint", "status"], registry=registry)
    served = Counter("splitspec_edge_generations", "Generations by who served them", ["served_by"], registry=registry)
    tokens_total = Counter("splitspec_edge_completion_tokens", "Completion tokens returned", registry=registry)
    ttft = Histogram("splitspec_edge_ttft_seconds", "Time to first token", registry=registry,
                     buckets=(0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30))

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        requests_total.labels(request.url.path, str(exc.status)).inc()
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        message = f"{where + ': ' if where else ''}{first.get('msg', 'invalid request')}"
        requests_total.labels(request.url.path, "400").inc()
        return ApiError(400, message, where).response()

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s", request.url.path)
        requests_total.labels(request.url.path, "500").inc()
        return ApiError(500, f"internal error: {type(exc).__name__}").response()

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not secrets.compare_digest(given.encode(), api_key.encode()):
            raise ApiError(401, "invalid API key", code="invalid_api_key")

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": service.config.model_name, "cloud": service.config.cloud,
                "cloud_reachable": service.cloud_reachable, "fallback": service.config.fallback}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        authorize(request)
        return {"object": "list", "data": [{
            "id": service.config.model_name, "object": "model", "created": 0, "owned_by": "splitspec",
            "splitspec": {"chat_template": service.template.description, "cloud": service.config.cloud,
                          "context_size": service.context_size},
        }]}

    def job_for(body: _Sampling, prompt: list[int], stops: list[str], max_tokens: int | None) -> Job:
        body.refuse_unsupported()
        room = service.context_size - len(prompt) - 1
        if room < 1:
            raise ApiError(400, f"the prompt has {len(prompt)} tokens; the context holds {service.context_size}",
                           "messages", "context_length_exceeded")
        wanted = max_tokens or min(DEFAULT_MAX_TOKENS, room)
        if wanted > room:
            raise ApiError(400, f"{len(prompt)} prompt tokens plus max_tokens {wanted} exceed the context of "
                           f"{service.context_size}", "max_tokens", "context_length_exceeded")
        return Job(prompt, body.sampling(), wanted, stops)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        authorize(request)
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages]
        prompt, format_stops = service.chat_prompt(messages)
        job = job_for(body, prompt, body.stops() + format_stops, body.max_completion_tokens or body.max_tokens)
        return await respond(request, body, job, chat=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        authorize(request)
        prompt = service.text_prompt(body.text())
        job = job_for(body, prompt, body.stops(), body.max_tokens)
        return await respond(request, body, job, chat=False)

    async def respond(request: Request, body: _Sampling, job: Job, *, chat: bool):
        if waiting["n"] >= max_waiting:
            raise ApiError(429, f"busy: {waiting['n']} requests are waiting for the device's drafter; retry later")
        waiting["n"] += 1
        try:
            await slot.acquire()
        finally:
            waiting["n"] -= 1
        events: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        cancelled = threading.Event()
        started = time.perf_counter()

        def work() -> None:
            def put(item) -> None:
                loop.call_soon_threadsafe(events.put_nowait, item)

            try:
                put(("done", service.run(job, lambda text: put(("text", text)), cancelled,
                                         on_start=lambda who: put(("start", who)))))
            except BaseException as exc:  # noqa: BLE001 - handed to the request
                put(("error", exc))

        future = loop.run_in_executor(worker, work)
        future.add_done_callback(lambda _f: slot.release())
        served_by = ""
        first = await _next_event(events, request, cancelled)  # an error before any text is still an HTTP status
        while first[0] == "start":
            served_by, first = first[1], await _next_event(events, request, cancelled)
        if first[0] == "error":
            raise _as_api_error(first[1])
        if first[0] == "text":
            ttft.observe(time.perf_counter() - started)
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(12)}"
        shape = _Shape(ident, service.config.model_name, chat)
        if not body.stream:
            text, outcome = [], None
            item = first
            while True:
                if item[0] == "text":
                    text.append(item[1])
                elif item[0] == "done":
                    outcome = item[1]
                    break
                else:
                    raise _as_api_error(item[1])
                item = await _next_event(events, request, cancelled)
            record(outcome, "200", request)
            return JSONResponse(shape.whole("".join(text), outcome), headers={SERVED_BY_HEADER: outcome.served_by})

        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        async def stream() -> AsyncIterator[str]:
            item = first
            try:
                if chat:
                    yield _sse(shape.chunk({"role": "assistant", "content": ""}))
                while True:
                    if item[0] == "text":
                        yield _sse(shape.chunk({"content": item[1]} if chat else item[1]))
                    elif item[0] == "done":
                        outcome = item[1]
                        yield _sse(shape.chunk({} if chat else "", outcome.finish_reason))
                        if include_usage:
                            yield _sse(shape.usage_chunk(outcome))
                        record(outcome, "200", request)
                        break
                    else:
                        yield _sse(_as_api_error(item[1]).body())
                        break
                    item = await events.get()
                yield "data: [DONE]\n\n"
            finally:
                cancelled.set()  # a client that went away stops the generation (no-op once it is over)

        headers = {SERVED_BY_HEADER: served_by, "Cache-Control": "no-cache"}
        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)

    def record(outcome: Outcome, status: str, request: Request) -> None:
        requests_total.labels(request.url.path, status).inc()
        served.labels(outcome.served_by).inc()
        tokens_total.inc(len(outcome.tokens))

    app.state.service = service
    app.state.waiting = waiting  # {"n": requests waiting for the drafter}
    return app


async def _next_event(events: asyncio.Queue, request: Request, cancelled: threading.Event, poll_s: float = 0.5):
    """The next event of the generation; a client that went away meanwhile (checked at most every
    ``poll_s``, events or not) cancels it, so its cloud session is closed, and ends the request
    (499: nobody reads it)."""
    state = request.state
    while True:
        now = time.monotonic()
        if now - getattr(state, "disconnect_checked", 0.0) >= poll_s:
            state.disconnect_checked = now
            if await request.is_disconnected():
                cancelled.set()
                raise ApiError(499, "the client closed the request")
        try:
            return await asyncio.wait_for(events.get(), poll_s)
        except TimeoutError:
            continue


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def _as_api_error(exc: BaseException) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, CloudUnavailable):
        return ApiError(503, f"the cloud verifier is unreachable and the fallback is off: {exc}",
                        code="cloud_unavailable")
    if isinstance(exc, VerifierError):
        return ApiError(400 if exc.bad_input else 502, f"the cloud verifier refused or failed: {exc}",
                        code="verifier_error")
    log.error("generation failed: %r", exc)
    return ApiError(500, f"generation failed: {type(exc).__name__}: {exc}")


class _Shape:
    """OpenAI response bodies for one request (chat or text completion)."""

    def __init__(self, ident: str, model: str, chat: bool) -> None:
        self.ident, self.model, self.chat, self.created = ident, model, chat, int(time.time())

    def _head(self, kind: str) -> dict:
        return {"id": self.ident, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": None}

    def whole(self, text: str, outcome: Outcome) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": outcome.finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": outcome.finish_reason}
        kind = "chat.completion" if self.chat else "text_completion"
        return {**self._head(kind), "choices": [choice], "usage": _usage(outcome),
                "splitspec_served_by": outcome.served_by}

    def chunk(self, delta, finish_reason: str | None = None) -> dict:
        if self.chat:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish_reason}
        return {**self._head("text_completion"), "choices": [choice]}

    def usage_chunk(self, outcome: Outcome) -> dict:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(kind), "choices": [], "usage": _usage(outcome), "splitspec_served_by": outcome.served_by}


def _usage(outcome: Outcome) -> dict:
    return {
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": len(outcome.tokens),
        "total_tokens": outcome.prompt_tokens + len(outcome.tokens),
        "splitspec": {
            "served_by": outcome.served_by,
            "acceptance_length": round(outcome.acceptance_length, 4),
            "bytes_up": outcome.bytes_up,
            "bytes_down": outcome.bytes_down,
            "cloud_forwards": outcome.cloud_forwards,
            "prompt_tokens_sent": outcome.prompt_tokens_sent,
        },
    }
