"""The OpenAI API's errors: ``ApiError`` and the handlers that answer every failure in its shape
(``{"error": {"message", "type", "param", "code"}}``), never with a traceback.

Each handler counts the request under its status in the app's metrics.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from edge.decode_loop import VerifierError
from edge.openai_api.state import app_state
from edge.serving import CloudUnavailable

__all__ = ["ApiError", "add_error_handlers", "as_api_error"]

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error for the client, in OpenAI's shape."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
             405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
             503: "service_unavailable", 500: "server_error"}

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def as_api_error(exc: BaseException) -> ApiError:
    """What a failed generation tells the client: 503 without a cloud, 400/502 from the verifier, else 500."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, CloudUnavailable):
        return ApiError(503, f"the cloud verifier is unreachable and the fallback is off: {exc}",
                        code="cloud_unavailable")
    if isinstance(exc, VerifierError):
        return ApiError(400 if exc.bad_input else 502, f"the cloud verifier refused or failed: {exc}",
                        code="verifier_error")
    log.error("generation failed: %r", exc)
    return ApiError(500, f"generation failed: {type(exc).__name__}: {exc}")


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    app_state(request).metrics.count(request.url.path, exc.status)
    return exc.response()


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    """A 400 naming the first invalid field (its path below the body, dotted) as ``param``."""
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
    message = f"{where + ': ' if where else ''}{first.get('msg', 'invalid request')}"
    app_state(request).metrics.count(request.url.path, 400)
    return ApiError(400, message, where).response()


async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Routing's own errors (404: no such path, 405: not that method) in the same shape."""
    app_state(request).metrics.count(request.url.path, exc.status_code)
    message = {404: f"no such endpoint: {request.url.path}",
               405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, str(exc.detail))
    return ApiError(exc.status_code, message, code=getattr(exc, "code", None)).response()


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error on %s", request.url.path)
    app_state(request).metrics.count(request.url.path, 500)
    return ApiError(500, f"internal error: {type(exc).__name__}").response()


def add_error_handlers(app: FastAPI) -> None:
    """Answer ``ApiError``, invalid requests (400), routing's 404 and 405 and anything unexpected (500) in
    OpenAI's shape."""
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _unexpected)
