"""Live sessions of the verifier: a bounded table with a TTL.

A session whose stream broke stays resumable for ``ttl_s`` (by its ticket);
``reap`` drops those past their time. The table never holds more than
``max_sessions`` entries; a full table refuses new sessions.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cloud.session import VerifierSession

__all__ = ["SessionTable", "SessionEntry", "TableFull"]


class TableFull(RuntimeError):
    """No room for another session."""


@dataclass
class SessionEntry:
    session_id: str
    ticket: bytes
    session: VerifierSession
    attached: bool = True  # a stream is driving it
    last_active: float = field(default_factory=time.monotonic)


class SessionTable:
    def __init__(self, max_sessions: int, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self._clock = clock
        self._by_ticket: dict[bytes, SessionEntry] = {}

    def __len__(self) -> int:
        return len(self._by_ticket)

    def reserve(self) -> None:
        """Raise TableFull unless a new session fits (after reaping expired ones)."""
        self.reap()
        if len(self._by_ticket) >= self.max_sessions:
            raise TableFull(f"the verifier is at its limit of {self.max_sessions} sessions; retry later")

    def add(self, session: VerifierSession) -> SessionEntry:
        self.reserve()
        entry = SessionEntry(session_id=secrets.token_hex(8), ticket=secrets.token_bytes(16), session=session)
        entry.last_active = self._clock()
        self._by_ticket[entry.ticket] = entry
        return entry

    def resume(self, ticket: bytes) -> SessionEntry | None:
        """Reattach a detached, unexpired session by its ticket."""
        self.reap()
        entry = self._by_ticket.get(bytes(ticket))
        if entry is None or entry.attached:
            return None
        entry.attached = True
        entry.last_active = self._clock()
        return entry

    def touch(self, entry: SessionEntry) -> None:
        entry.last_active = self._clock()

    def detach(self, entry: SessionEntry) -> None:
        """The stream ended without finishing: keep the session for ``ttl_s``."""
        entry.attached = False
        entry.last_active = self._clock()

    def remove(self, entry: SessionEntry) -> None:
        self._by_ticket.pop(entry.ticket, None)

    def reap(self) -> int:
        """Drop detached sessions idle past the TTL; returns how many."""
        now = self._clock()
        expired = [t for t, e in self._by_ticket.items() if not e.attached and now - e.last_active > self.ttl_s]
        for ticket in expired:
            del self._by_ticket[ticket]
        return len(expired)
