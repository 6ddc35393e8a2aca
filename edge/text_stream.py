"""Streaming committed tokens to a terminal as text."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

__all__ = ["TextStream"]


class TextStream:
    """Prints decoded text as tokens are committed, never re-printing a character."""

    def __init__(self, detokenize: Callable[[Sequence[int]], str], out=sys.stdout) -> None:
        self._detokenize = detokenize
        self._out = out
        self._tokens: list[int] = []
        self._printed = 0

    def __call__(self, tokens: Sequence[int]) -> None:
        self._tokens.extend(tokens)
        text = self._detokenize(self._tokens)
        if len(text) > self._printed:
            self._out.write(text[self._printed :])
            self._out.flush()
            self._printed = len(text)
