"""``splitspec-edge serve``: an OpenAI-compatible HTTP server on the device.

FastAPI routers (``edge.openai_api``) over ``edge.serving.EdgeService``: ``POST
/v1/chat/completions`` and ``POST /v1/completions`` (streaming as server-sent events, or
whole), ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus). Errors use OpenAI's
shape (``{"error": {"message", "type", "param", "code"}}``) and never carry a traceback; a body
over ``MAX_BODY_BYTES`` gets 413 before anything reads it, and prompts are tokenized off the event
loop.

One generation runs at a time (the device has one drafter); further requests wait their turn,
up to ``max_waiting``, then get 429. A client that goes away mid-stream stops its generation,
and its cloud session is closed.
"""

from __future__ import annotations

from fastapi import Depends, FastAPI

from edge.openai_api import chat, completions, health, models
from edge.openai_api.auth import require_api_key
from edge.openai_api.body_limit import BodyLimit
from edge.openai_api.errors import add_error_handlers
from edge.openai_api.metrics import ServerMetrics
from edge.openai_api.schemas import DEFAULT_MAX_TOKENS
from edge.openai_api.state import AppState, DrafterTurns
from edge.serving import EdgeService

__all__ = ["create_app", "DEFAULT_MAX_TOKENS"]


def create_app(service: EdgeService, *, api_key: str | None = None, max_waiting: int = 8) -> FastAPI:
    """The FastAPI app over ``service``; ``api_key`` set: /v1/* needs ``Authorization: Bearer <key>``.

    Its state is ``app.state.edge`` (an ``AppState``)."""
    app = FastAPI(title="splitspec edge", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.edge = AppState(service, DrafterTurns(max_waiting), ServerMetrics(), api_key)
    add_error_handlers(app)
    app.add_middleware(BodyLimit)
    app.include_router(health.router)
    for router in (models.router, chat.router, completions.router):
        app.include_router(router, prefix="/v1", dependencies=[Depends(require_api_key)])
    return app
