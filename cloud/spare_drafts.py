"""What a forward for the next token verifies beside it for about its cost: spare drafts.

Two kinds, both greedy and coupled modes only (a draft's q̃ in rejection mode
is the drafter's on the path it was drafted on, and a proposal has none):

- a stale block's *rebased* drafts: those the edge sent for positions past the
  committed tokens, drafted past a token the target did not pick, verified
  where they lie (``SpareDrafts``);
- the cloud's own *proposals* while it decodes alone: what followed the
  latest earlier occurrence of the committed tokens' last few
  (``shared.lookup``), for an edge that takes them.

How many ride is ``free_drafts``: what the forward's rows are padded to anyway
on a CPU, ``MAX_FREE_DRAFTS`` on an accelerator. Pure: no model, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from cloud.pending_block import by_position

__all__ = ["MAX_FREE_DRAFTS", "SpareDrafts", "free_drafts"]

# Drafts a forward for the next token verifies beside it on an accelerator (rebased ones or the cloud's own
# proposals), where a decode forward is memory-bound up to tens of rows, so a few more cost next to nothing;
# the cap bounds what each session alone with the cloud adds to a packed forward (on a CPU the row tile
# says how many are free).
MAX_FREE_DRAFTS = 8


def free_drafts(rows_at_cost_of_one: int | None, draft_limit: int) -> int:
    """Drafts a forward for the next token may verify for about its cost: ``rows_at_cost_of_one`` (the
    rows a one-row forward is padded to; None on an accelerator) less the token's own row, at most
    ``MAX_FREE_DRAFTS`` on an accelerator, within ``draft_limit``."""
    return min(draft_limit, MAX_FREE_DRAFTS if rows_at_cost_of_one is None else rows_at_cost_of_one - 1)


class SpareDrafts:
    """Drafts the edge sent past the committed tokens, by position (position -> id)."""

    def __init__(self) -> None:
        self._at: dict[int, int] = {}

    def add(self, start_position: int, drafts: Sequence[int]) -> None:
        """A stale block's drafts, the first at ``start_position`` (newer ones replace older)."""
        self._at.update(by_position(start_position, drafts))

    def replace(self, at: dict[int, int]) -> None:
        """Keep only ``at`` (position -> id): the drafts past a correction."""
        self._at = dict(at)

    def clear(self) -> None:
        self._at = {}

    def run_from(self, position: int, most: int) -> list[int]:
        """The drafts from ``position`` on, as many as lie there in a row, at most ``most``; those before
        ``position`` are forgotten (the committed tokens hold them)."""
        self._at = {p: t for p, t in self._at.items() if p >= position}
        run = []
        while len(run) < most and position + len(run) in self._at:
            run.append(self._at[position + len(run)])
        return run
