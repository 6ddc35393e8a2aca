"""``GET /models``: the one model the device serves, with its chat template, cloud and context size."""

from __future__ import annotations

from fastapi import APIRouter

from edge.openai_api.state import StateDep

__all__ = ["router"]

router = APIRouter()


@router.get("/models")
async def models(state: StateDep) -> dict:
    service = state.service
    return {"object": "list", "data": [{
        "id": service.config.model_name, "object": "model", "created": 0, "owned_by": "splitspec",
        "splitspec": {"chat_template": service.template.description, "cloud": service.config.cloud,
                      "context_size": service.context_size},
    }]}
