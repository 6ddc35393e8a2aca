"""A stream's frames read and not yet verified: bounded in count and in bytes.

An honest edge has at most ``max_blocks_in_flight`` blocks unanswered (kilobytes each), then a Close.
A stream that stops reading its verdicts, or sends frames as large as the wire allows, must not grow
the verifier's memory by what it sends: past either bound the reader waits and reads nothing more,
and HTTP/2 flow control holds the edge's next frames on its side. One frame is always taken when the
queue is empty, whatever its size (a frame the wire let through is one the protocol allows).
"""

from __future__ import annotations

import asyncio

__all__ = ["FrameQueue"]


class FrameQueue(asyncio.Queue):
    """An ``asyncio.Queue`` of at most ``maxsize`` items holding at most ``max_bytes`` of Draft frames
    (items are ``(Draft, arrival time)`` or markers of no size). Event-loop only."""

    def __init__(self, maxsize: int, max_bytes: int) -> None:
        super().__init__(maxsize)
        self.max_bytes = max_bytes
        self.bytes = 0  # what the queued frames hold (their serialized size)

    @staticmethod
    def _size(item) -> int:
        return item[0].ByteSize() if isinstance(item, tuple) else 0

    def full(self) -> bool:
        return super().full() or (self.bytes >= self.max_bytes and not self.empty())

    def _put(self, item) -> None:
        self.bytes += self._size(item)
        super()._put(item)

    def _get(self):
        item = super()._get()
        self.bytes -= self._size(item)
        return item
