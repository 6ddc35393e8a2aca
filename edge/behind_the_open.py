"""What goes up right behind an Open, before its Opened: the early block or a head start.

The early block is drafted on a thread while the prompt is prefilled
(``edge.early_block``); it goes out as soon as it is drafted, if that is
before the Opened arrives, and never on a later Open (a retried Open goes
without it). A head start is a window of empty blocks sent behind the Open
(the cloud decodes alone from its prefill). Both are sent once, through the
connection's ``send``; this module keeps only which went.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

from edge.drafter import DraftBlock

__all__ = ["BehindTheOpen"]

# send(epoch, start_position, block, more_follows, before_opened=True) -> the record of the block sent
Send = Callable[..., object]


class BehindTheOpen:
    """One session's early block and head start, armed by ``open`` and sent behind its first Open."""

    def __init__(self) -> None:
        self._early: Future | None = None  # armed: resolves to (block, more_follows)
        self._head_start = 0  # armed: empty blocks to send
        self._lock = threading.Lock()
        self._attempt: object | None = None  # the Open whose early block may still go (until its Opened)
        self.early_sent: object | None = None  # the early block's record, once sent

    def arm(self, early_block: Future | None, head_start: int) -> None:
        """What the next Open carries behind it (nothing: ``arm(None, 0)``)."""
        self._early, self._head_start = early_block, head_start

    def send_early_block(self, start_position: int, send: Send) -> None:
        """With an Open on its way: the armed early block goes for ``start_position`` at epoch 0 as soon
        as it is drafted, if that is before ``opened`` is called (once: a retried Open goes without it)."""
        future, self._early = self._early, None
        attempt = object()
        with self._lock:
            self.early_sent, self._attempt = None, attempt if future is not None else None
        if future is None:
            return

        def ready(done) -> None:  # on the drafting thread (or here, when it is done already)
            made = None if done.cancelled() or done.exception() else done.result()
            with self._lock:
                if made and self._attempt is attempt:  # (this Open's, and its Opened not come yet)
                    block, more_follows = made
                    self.early_sent = send(0, start_position, block, more_follows, before_opened=True)

        future.add_done_callback(ready)

    def send_head_start(self, start_position: int, send: Send) -> int:
        """With an Open on its way: the armed head start, that many empty blocks from ``start_position`` at
        epoch 0 (once: a retried Open goes without them); returns how many went."""
        count, self._head_start = self._head_start, 0
        for i in range(count):
            send(0, start_position + i, DraftBlock([]), False, before_opened=True)
        return count

    def opened(self) -> None:
        """The Opened came (or the attempt failed): an early block not sent by now stays unsent."""
        with self._lock:
            self._attempt = None
