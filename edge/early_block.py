"""The first block, drafted while the Open is in flight.

Cloud-only decoding streams its first token as soon as the prompt is read;
the split used to wait for it, then draft, then pay a round trip before its
first block was verified. Instead the drafter reads the prompt and drafts on a
thread right away: its own guess for the first token (not sent: the cloud
answers that position from the prefill), then a block after it. The
connection sends the block if it is ready before the Opened arrives
(``Draft.before_opened``), so the cloud verifies it as soon as it has answered
the first position. A wrong guess costs that block's verify; the output is
unaffected (any drafts are verified against the target).

The block is short (``EARLY_DRAFT_LEN``) so that its drafting is over before
the Opened arrives: on a one-core device a drafter still running then delays
the first token (measured here with eight drafts: about +25 ms on a 0.37 s
time to first token; with four, none that the noise shows). The chain goes on
from it as from any block.

The drafter is not thread-safe: ``finish`` waits for the thread and must be
called before the drafter is touched again.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future

from edge.drafter import DraftBlock, Drafter
from shared.params import SamplingParams

__all__ = ["EARLY_DRAFT_LEN", "EarlyBlock"]

EARLY_DRAFT_LEN = 4  # drafts in the early block at most (with the guess: five drafter steps during the prefill)


class EarlyBlock:
    """Drafts the first block on a thread; ``future`` resolves to (block, more_follows) or None."""

    def __init__(self, drafter: Drafter, prompt: Sequence[int], params: SamplingParams, draft_len: int,
                 more_follows_below: int) -> None:
        """``draft_len``: drafts in the block; a block shorter than ``more_follows_below`` is sent
        with ``more_follows`` (the generation goes on past it)."""
        self.drafter = drafter
        self.future: Future = Future()
        self.guess: int | None = None  # the drafter's token for the first position
        self.block: DraftBlock | None = None
        self.more_follows = False
        self.sent_at = 0.0  # perf_counter when the block was ready
        self.draft_s = 0.0  # drafting time, the prompt read included
        self._finished = False
        self._thread = threading.Thread(
            target=self._run, args=(list(prompt), params, draft_len, more_follows_below), name="edge-early-block",
            daemon=True,
        )
        self._thread.start()

    def _run(self, prompt: list[int], params: SamplingParams, draft_len: int, more_follows_below: int) -> None:
        _yield_to_others()
        try:
            started = time.perf_counter()
            self.drafter.begin(prompt, params)
            guess = self.drafter.draft(1).tokens
            block = self.drafter.draft(draft_len) if guess else DraftBlock([])
            self.sent_at = time.perf_counter()
            self.draft_s = self.sent_at - started
            if not block.tokens:
                self.future.set_result(None)
                return
            self.guess, self.block = guess[0], block
            self.more_follows = len(block.tokens) < more_follows_below
            self.future.set_result((block, self.more_follows))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on it
            self.future.set_exception(exc)

    def finish(self, kept: bool) -> None:
        """Wait for the drafting; when the block does not stand (``kept`` False: it went out too
        late or was dropped), the drafter forgets it and its guess. Raises what drafting raised."""
        if self._finished:
            return
        self._thread.join()
        self._finished = True
        self.future.result()
        if not kept:
            self.drafter.rewind()


def _yield_to_others() -> None:
    """Lower this thread's CPU priority (Linux: threads are tasks with their own nice value), so
    that on a device with few cores the thread reading the Opened, which carries the first token,
    is not kept waiting by the drafting."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):  # not Linux, or not allowed: drafting just competes evenly
        pass
