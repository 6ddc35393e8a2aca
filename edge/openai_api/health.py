"""``GET /health`` (the cloud's state with it, ``edge.cloud_health``) and ``GET /metrics``
(Prometheus): open to all, no API key."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse

from edge.openai_api.state import StateDep

__all__ = ["router"]

router = APIRouter()


@router.get("/health")
def health(state: StateDep) -> JSONResponse:
    """200 ``{"status": "ok", "cloud": "ready"}`` while the verifier answers its health check; else 503
    with ``status`` "loading" or "degraded" and the ``reason``, or, with the local fallback, 200 "ok"
    served drafter-only. Also the model, the cloud's address and the fallback. (Sync: FastAPI runs it
    on a worker thread, the probe may take up to its timeout.)"""
    service = state.service
    answer = service.health()
    body = {"status": answer.status, "cloud": answer.cloud.state, "serving": answer.serving,
            "model": service.config.model_name, "cloud_address": service.config.cloud,
            "fallback": service.config.fallback}
    if answer.cloud.reason:
        body["reason"] = answer.cloud.reason
    return JSONResponse(body, status_code=answer.http_status)


@router.get("/metrics")
async def metrics(state: StateDep) -> PlainTextResponse:
    body, content_type = state.metrics.exposition()
    return PlainTextResponse(body, media_type=content_type)
