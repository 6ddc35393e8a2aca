"""One completion request's generation, from its turn on the drafter to the HTTP answer.

Whole (JSON) or streamed as server-sent events written directly (``data:`` lines, ``data:
[DONE]``): the stream is one-way and short-lived, so sse-starlette's keep-alive pings and
reconnection ids would add nothing. An error before any text is an HTTP status; one after it is
the stream's last event. A client that goes away stops the generation, and its cloud session
is closed.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from edge.openai_api.errors import ApiError, as_api_error
from edge.openai_api.metrics import ServerMetrics
from edge.openai_api.responses import SERVED_BY_HEADER, Shape, sse
from edge.openai_api.schemas import SamplingRequest
from edge.openai_api.state import AppState
from edge.serving import Job

__all__ = ["respond"]

Event = tuple[str, Any]  # ("start", served_by) | ("text", str) | ("done", Outcome) | ("error", BaseException)


async def respond(request: Request, state: AppState, body: SamplingRequest, job: Job, *, chat: bool) -> Response:
    """Run ``job`` in its turn on the drafter and answer the request (``body.stream``: a stream).

    429 when ``max_waiting`` requests already wait for the drafter."""
    turns = state.turns
    if turns.full:
        raise ApiError(429, f"busy: {turns.waiting} requests are waiting for the device's drafter; retry later")
    await turns.take()
    run = _Run(request, asyncio.Queue(), threading.Event())
    started = time.perf_counter()
    turns.start(run.worker(state, job))
    served_by = ""
    first = await run.next()  # an error before any text is still an HTTP status
    while first[0] == "start":
        served_by, first = first[1], await run.next()
    if first[0] == "error":
        raise as_api_error(first[1])
    if first[0] == "text":
        state.metrics.ttft.observe(time.perf_counter() - started)
    shape = Shape(f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(12)}", state.service.config.model_name, chat)
    if not body.stream:
        return await _whole(run, state.metrics, shape, first)
    headers = {SERVED_BY_HEADER: served_by, "Cache-Control": "no-cache"}
    return StreamingResponse(_stream(run, state.metrics, shape, first, body.include_usage),
                             media_type="text/event-stream", headers=headers)


@dataclass
class _Run:
    """One generation as its request sees it."""

    request: Request
    events: asyncio.Queue  # of Event, put from the worker thread
    cancelled: threading.Event  # set: the generation stops (a no-op once it is over)

    def worker(self, state: AppState, job: Job) -> Callable[[], None]:
        """The work for the drafter's thread: ``job`` on the service, every event onto ``events``."""
        loop = asyncio.get_running_loop()

        def put(item: Event) -> None:
            loop.call_soon_threadsafe(self.events.put_nowait, item)

        def work() -> None:
            try:
                put(("done", state.service.run(job, lambda text: put(("text", text)), self.cancelled,
                                               on_start=lambda who: put(("start", who)))))
            except BaseException as exc:  # noqa: BLE001 - handed to the request
                put(("error", exc))

        return work

    async def next(self, poll_s: float = 0.5) -> Event:
        """The next event of the generation; a client that went away meanwhile (checked at most every
        ``poll_s``, events or not) cancels it, so its cloud session is closed, and ends the request
        (499: nobody reads it)."""
        state = self.request.state
        while True:
            now = time.monotonic()
            if now - getattr(state, "disconnect_checked", 0.0) >= poll_s:
                state.disconnect_checked = now
                if await self.request.is_disconnected():
                    self.cancelled.set()
                    raise ApiError(499, "the client closed the request")
            try:
                return await asyncio.wait_for(self.events.get(), poll_s)
            except TimeoutError:
                continue


async def _whole(run: _Run, metrics: ServerMetrics, shape: Shape, item: Event) -> JSONResponse:
    """The completion as one JSON body, once the generation is done."""
    text = []
    while item[0] != "done":
        if item[0] != "text":
            raise as_api_error(item[1])
        text.append(item[1])
        item = await run.next()
    outcome = item[1]
    metrics.record(run.request.url.path, outcome)
    return JSONResponse(shape.whole("".join(text), outcome), headers={SERVED_BY_HEADER: outcome.served_by})


async def _stream(run: _Run, metrics: ServerMetrics, shape: Shape, item: Event, include_usage: bool
                  ) -> AsyncIterator[str]:
    """The completion as server-sent events from ``item`` on; closing it early cancels the generation."""
    try:
        if shape.chat:
            yield sse(shape.chunk({"role": "assistant", "content": ""}))
        while True:
            if item[0] == "text":
                yield sse(shape.chunk({"content": item[1]} if shape.chat else item[1]))
            elif item[0] == "done":
                outcome = item[1]
                yield sse(shape.chunk({} if shape.chat else "", outcome.finish_reason))
                if include_usage:
                    yield sse(shape.usage_chunk(outcome))
                metrics.record(run.request.url.path, outcome)
                break
            else:
                yield sse(as_api_error(item[1]).body())
                break
            item = await run.events.get()
        yield "data: [DONE]\n\n"
    finally:
        run.cancelled.set()  # a client that went away stops the generation (no-op once it is over)
