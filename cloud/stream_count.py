"""Streams per identity: how many Decode and Generate calls each client has open, its Open sent or not.

A session slot is bounded by the session table; a stream is not, until it has opened one. Counting
every stream from its first byte bounds what one client can hold before any Open (each a coroutine
and a read waiting ``open_timeout_s``) and how many streams it keeps beside its sessions (a resume
opens a new stream while the old one dies, so the bound sits above the sessions per client).
"""

from __future__ import annotations

__all__ = ["StreamCount"]


class StreamCount:
    """At most ``limit`` open streams per identity (``cloud.identity``). Event-loop only."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: dict[str, int] = {}

    def enter(self, identity: str) -> bool:
        """Count a new stream of ``identity``; False (not counted) when it is at its limit."""
        held = self._open.get(identity, 0)
        if held >= self.limit:
            return False
        self._open[identity] = held + 1
        return True

    def leave(self, identity: str) -> None:
        """One of ``identity``'s streams ended (after ``enter`` said True)."""
        held = self._open.get(identity, 0) - 1
        if held > 0:
            self._open[identity] = held
        else:
            self._open.pop(identity, None)

    def held(self, identity: str) -> int:
        return self._open.get(identity, 0)
