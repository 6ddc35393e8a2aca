"""Errors the command line shows as one line, without a traceback."""

from __future__ import annotations

__all__ = ["CliError"]


class CliError(Exception):
    """A failure the user can act on. ``exit_code`` 2 means bad input."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code
