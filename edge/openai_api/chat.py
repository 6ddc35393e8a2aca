"""``POST /chat/completions``: the messages rendered by the service's chat template, then generated.

``developer`` messages count as ``system``; the template's own stop strings join the request's.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from edge.openai_api.generation import respond
from edge.openai_api.schemas import ChatRequest, job_for
from edge.openai_api.state import StateDep

__all__ = ["router"]

router = APIRouter()


@router.post("/chat/completions")
async def chat_completions(body: ChatRequest, request: Request, state: StateDep) -> Response:
    service = state.service
    messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages]
    prompt, format_stops = await run_in_threadpool(service.chat_prompt, messages)  # (off the event loop)
    job = job_for(body, prompt, body.stops() + format_stops, body.max_completion_tokens or body.max_tokens,
                  service.context_size)
    return await respond(request, state, body, job, chat=True)
