"""How one verifier stream ends: ``Abort`` for a problem, ``EndLog`` for the line it leaves.

Contract. ``Abort`` ends its own stream only, with a gRPC status code; ``park``
keeps the stream's session resumable by its ticket instead of dropping it. The
servicer catches it at the RPC boundary; nothing below the RPCs aborts a
context itself. ``EndLog`` writes at most ``_LOG_LINES_PER_S`` lines a second,
so a flood of bad streams cannot flood the log.

Every RPC's request messages are parsed in one place, ``ParseRequests``: a
message that is not protobuf reaches the servicer as ``Malformed`` (where gRPC
itself would answer UNKNOWN and log a traceback), and ``parsed`` turns it into
the ``Abort`` with ``INVALID_ARGUMENT`` that any other bad frame gets.
"""

from __future__ import annotations

import logging
import time

import grpc

from cloud.session_table import SessionEntry

__all__ = ["Abort", "EndLog", "Malformed", "ParseRequests", "parsed"]

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


class Malformed:
    """A request message that did not parse: what the servicer gets instead of gRPC's own error."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error  # the parser's exception type


def parsed(message, what: str = "frame"):
    """``message``, unless it is ``Malformed``: then the ``Abort`` (INVALID_ARGUMENT) of a malformed ``what``."""
    if isinstance(message, Malformed):
        raise Abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {what}: {message.error}")
    return message


def _tolerant(deserializer):
    def parse(data: bytes):
        try:
            return deserializer(data)
        except Exception as exc:  # noqa: BLE001 - any parser failure is the sender's fault
            return Malformed(type(exc).__name__)

    return parse


class ParseRequests(grpc.aio.ServerInterceptor):
    """Gives every RPC of ``service`` (its full name) a request parser that never raises (``Malformed``)."""

    def __init__(self, service: str) -> None:
        self._prefix = f"/{service}/"

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None or not details.method.startswith(self._prefix):
            return handler
        return handler._replace(request_deserializer=_tolerant(handler.request_deserializer))
