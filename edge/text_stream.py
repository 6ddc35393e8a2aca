"""Committed tokens as text, piece by piece: to a terminal, or as deltas for a stream of events."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

__all__ = ["TextDeltas", "TextStream", "StopMatcher"]


class TextDeltas:
    """Turns tokens, as they are committed, into the text each adds (never repeating a character;
    an incomplete UTF-8 tail waits for its bytes)."""

    def __init__(self, detokenize: Callable[[Sequence[int]], str]) -> None:
        self._detokenize = detokenize
        self.tokens: list[int] = []
        self.text = ""

    def add(self, tokens: Sequence[int]) -> str:
        """The text ``tokens`` add."""
        self.tokens.extend(tokens)
        text = self._detokenize(self.tokens)
        if len(text) <= len(self.text):
            return ""
        delta, self.text = text[len(self.text) :], text
        return delta


class TextStream:
    """Prints decoded text as tokens are committed, never re-printing a character."""

    def __init__(self, detokenize: Callable[[Sequence[int]], str], out=sys.stdout) -> None:
        self._deltas = TextDeltas(detokenize)
        self._out = out

    def __call__(self, tokens: Sequence[int]) -> None:
        delta = self._deltas.add(tokens)
        if delta:
            self._out.write(delta)
            self._out.flush()


class StopMatcher:
    """Stop strings over streamed text: ``feed`` returns the text safe to emit and whether a stop
    string was found (the text ends before it). Text that could begin a stop string is held back
    until the next piece decides."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False

    def feed(self, delta: str) -> str:
        if self.stopped:
            return ""
        text = self._held + delta
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped, self._held = True, ""
            return text[: min(hits)]
        hold = max((k for s in self.stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        self._held = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold]

    def flush(self) -> str:
        """What is still held back, once the text is complete."""
        held, self._held = self._held, ""
        return "" if self.stopped else held
