"""A session's drafts per block: the limit it opened with, and the one fair share may lower it to.

A limit lowered at epoch e holds for blocks of every later epoch; blocks of e
or earlier keep the opened one (the edge drafted them before it could know).
A limit only comes down; a new turn (``reopen``) starts from what it asks for, a lowering kept.
Pure state: no model, no I/O.
"""

from __future__ import annotations

__all__ = ["DraftLimit"]


class DraftLimit:
    """The most drafts (guesses included) a session's blocks may hold."""

    def __init__(self, opened: int) -> None:
        self.opened = opened  # as the Open asked (within the service's limit)
        self.lowered = 0  # the lowered limit (0: not lowered)
        self._since_epoch = 0  # ... for blocks of epochs after this one

    @property
    def current(self) -> int:
        """Drafts per block the edge is held to from now on."""
        return self.lowered or self.opened

    def beside(self, held: int) -> int:
        """The most drafts a forward may verify for a verdict that carries ``held`` tokens decoded ahead in
        front of them: the edge refuses a verdict that verified more than the Open's limit in all
        (``edge.verdict_checks``), and holds its later blocks to ``current``."""
        return max(0, min(self.current, self.opened - held))

    def for_epoch(self, epoch: int) -> int:
        """The most drafts a block of ``epoch`` may hold."""
        return self.lowered if self.lowered and epoch > self._since_epoch else self.opened

    def lower(self, limit: int, epoch: int) -> bool:
        """Hold blocks of epochs after ``epoch`` to ``limit``; True when that lowered the limit."""
        if not 1 <= limit < self.current:
            return False
        self.lowered, self._since_epoch = limit, epoch
        return True

    def reopen(self, opened: int) -> None:
        """A new turn: the limit it asked for, still lowered where it was (from the turn's first block: a
        penalty outlives the turn it came in, or a client would shake it off by starting another)."""
        lowered = self.lowered if 0 < self.lowered < opened else 0
        self.opened, self.lowered, self._since_epoch = opened, lowered, -1
