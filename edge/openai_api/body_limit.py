"""A request body larger than the server takes is refused before anything reads it: 413, in OpenAI's shape.

A pure ASGI middleware: a declared ``Content-Length`` over the limit is refused at once; a body
sent without one (chunked) is counted as it arrives and refused once it passes the limit, so no
request holds more than the limit in memory.
"""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException

__all__ = ["MAX_BODY_BYTES", "BodyLimit"]

# A request body at most: a prompt of the drafter's whole context in JSON is well under 1 MiB
# (32k tokens of ~4 bytes), so this refuses only what no request needs (an 8 MB prompt stalled the
# server for seconds while it was tokenized).
MAX_BODY_BYTES = 4 << 20


class _TooLarge(HTTPException):
    """Raised from ``receive`` while the app reads the body: an HTTP error FastAPI passes on as it is
    (any other error while reading the body it turns into a 400), answered by the app's handler."""

    code = "request_too_large"

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"the request body exceeds {max_bytes} bytes")


class BodyLimit:
    """Refuse HTTP request bodies over ``max_bytes`` with 413."""

    def __init__(self, app, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._refuse(send)
            return
        seen = 0
        started = False

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge(self.max_bytes)
            return message

        async def watched(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except _TooLarge:  # (read outside a route, where no handler answered it)
            if not started:
                await self._refuse(send)

    async def _refuse(self, send) -> None:
        body = json.dumps({"error": {"message": f"the request body exceeds {self.max_bytes} bytes",
                                     "type": "invalid_request_error", "param": None,
                                     "code": "request_too_large"}}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
