"""What the OpenAI API's routes share, set once on ``app.state.edge`` by ``create_app``: the
service, the turns on the device's drafter, the metrics and the API key. Routes reach it through
the ``StateDep`` dependency, handlers through ``app_state``; nothing else holds it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from edge.openai_api.metrics import ServerMetrics
from edge.serving import EdgeService

__all__ = ["AppState", "DrafterTurns", "StateDep", "app_state"]


class DrafterTurns:
    """One generation at a time on the device's drafter (one worker thread runs them); the rest
    wait their turn. It counts who waits and refuses nobody: the caller checks ``full`` first.
    Made on any thread, used on one event loop."""

    def __init__(self, max_waiting: int) -> None:
        self.max_waiting = max_waiting
        self.waiting = 0  # requests waiting for the drafter now
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edge-generate")
        self._slot = asyncio.Semaphore(1)

    @property
    def full(self) -> bool:
        return self.waiting >= self.max_waiting

    async def take(self) -> None:
        """Wait for the drafter; the turn is the caller's until the work it ``start``s ends."""
        self.waiting += 1
        try:
            await self._slot.acquire()
        finally:
            self.waiting -= 1

    def start(self, work: Callable[[], None]) -> None:
        """Run ``work`` on the drafter's thread in the turn taken; when it ends, the next waiter goes."""
        future = asyncio.get_running_loop().run_in_executor(self.worker, work)
        future.add_done_callback(lambda _f: self._slot.release())


@dataclass
class AppState:
    """One app's shared state, made by ``create_app`` and never replaced."""

    service: EdgeService
    turns: DrafterTurns
    metrics: ServerMetrics
    api_key: str | None  # set: /v1/* needs ``Authorization: Bearer <api_key>``


def app_state(request: Request) -> AppState:
    """The state of the app serving ``request``."""
    return request.app.state.edge


StateDep = Annotated[AppState, Depends(app_state)]
