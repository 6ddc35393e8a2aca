"""How one verifier stream ends: ``Abort`` for a problem, ``EndLog`` for the line it leaves.

Contract. ``Abort`` ends its own stream only, with a gRPC status code; ``park``
keeps the stream's session resumable by its ticket instead of dropping it. The
servicer catches it at the RPC boundary; nothing below the RPCs aborts a
context itself. ``EndLog`` writes at most ``_LOG_LINES_PER_S`` lines a second,
so a flood of bad streams cannot flood the log.
"""

from __future__ import annotations

import logging
import time

import grpc

from cloud.session_table import SessionEntry

__all__ = ["Abort", "EndLog"]

log = logging.getLogger("cloud.servicer")  # (the name operators filter on)

_LOG_LINES_PER_S = 20  # session-end log lines per second at most


class Abort(Exception):
    """Ends one stream with ``code``; ``park`` keeps its session resumable instead of dropping it."""

    def __init__(self, code: grpc.StatusCode, message: str, park: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.park = park


class EndLog:
    """One line per ended session, rate-limited (the skipped count goes on the next line written)."""

    def __init__(self) -> None:
        self._window_start, self._lines, self._skipped = 0.0, 0, 0

    def ended(self, entry: SessionEntry | None, exc: Abort) -> None:
        now = time.monotonic()
        if now - self._window_start >= 1.0:
            self._window_start, self._lines = now, 0
        self._lines += 1
        if self._lines > _LOG_LINES_PER_S:
            self._skipped += 1
            return
        skipped = f" ({self._skipped} more not logged)" if self._skipped else ""
        self._skipped = 0
        log.info("session %s ended: %s: %s%s", entry.session_id if entry else "-", exc.code.name, exc, skipped)
