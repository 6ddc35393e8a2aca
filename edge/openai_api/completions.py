"""``POST /completions``: one text prompt, tokenized as it is (no chat template), then generated."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from edge.openai_api.generation import respond
from edge.openai_api.schemas import CompletionRequest, job_for
from edge.openai_api.state import StateDep

__all__ = ["router"]

router = APIRouter()


@router.post("/completions")
async def completions(body: CompletionRequest, request: Request, state: StateDep) -> Response:
    service = state.service
    prompt = await run_in_threadpool(service.text_prompt, body.text())  # (off the event loop)
    job = job_for(body, prompt, body.stops(), body.max_tokens, service.context_size)
    return await respond(request, state, body, job, chat=False)
