"""``GET /health`` and ``GET /metrics`` (Prometheus): open to all, no API key."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from edge.openai_api.state import StateDep

__all__ = ["router"]

router = APIRouter()


@router.get("/health")
async def health(state: StateDep) -> dict:
    """The service is up; its model, its cloud, whether the cloud is reachable now, and the fallback."""
    service = state.service
    return {"status": "ok", "model": service.config.model_name, "cloud": service.config.cloud,
            "cloud_reachable": service.cloud_reachable, "fallback": service.config.fallback}


@router.get("/metrics")
async def metrics(state: StateDep) -> PlainTextResponse:
    body, content_type = state.metrics.exposition()
    return PlainTextResponse(body, media_type=content_type)
