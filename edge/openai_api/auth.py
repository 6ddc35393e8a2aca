"""Bearer auth for ``/v1/*``: the ``require_api_key`` dependency.

With no API key set every request passes; with one, a request whose ``Authorization: Bearer``
token differs (or is missing) gets OpenAI's 401 (``invalid_api_key``), compared in constant time.
It runs before the body is validated; the scheme is matched as RFC 7235 says (any case), and a
header without one carries no token.
"""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from edge.openai_api.errors import ApiError
from edge.openai_api.state import StateDep

__all__ = ["require_api_key"]

_bearer = HTTPBearer(auto_error=False)  # its own 401 body is FastAPI's ``detail``, not OpenAI's shape


async def require_api_key(
    state: StateDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """Pass, or raise the 401 ``ApiError``."""
    if state.api_key is None:
        return
    given = credentials.credentials if credentials is not None else ""
    if not secrets.compare_digest(given.encode(), state.api_key.encode()):
        raise ApiError(401, "invalid API key", code="invalid_api_key")
