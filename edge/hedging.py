"""Hedge branches: which drafts of a block to hedge, and what each branch says.

A branch bets on the target's correction at one draft, the drafter's own
runner-up there (in coupled mode the second place of the same race the target
runs, so a strong guess), and continues it with a few drafted tokens. When the
target rejects that draft and its correction is the bet, the cloud verifies
the branch's continuation in the same forward, and the round commits past the
correction instead of ending there. The drafts hedged are the ``width`` least
certain ones (smallest ``DraftBlock.margins``). Greedy and coupled modes only.
"""

from __future__ import annotations

from dataclasses import replace

from edge.drafter import DraftBlock, Drafter

__all__ = ["BRANCH_LEN", "hedge"]

BRANCH_LEN = 3  # tokens per branch: the guessed correction and two drafted after it


def hedge(drafter: Drafter, block: DraftBlock, width: int, branch_len: int = BRANCH_LEN) -> DraftBlock:
    """``block`` with up to ``width`` branches, each ``branch_len`` tokens at most; unchanged when
    the drafter has no runner-ups (rejection mode, model-free drafters) or ``width`` is 0."""
    if width <= 0 or not block.runner_up or block.q is not None:
        return block
    margins = block.margins or [None] * len(block.tokens)
    candidates = [i for i, guess in enumerate(block.runner_up) if guess is not None]
    chosen = sorted(candidates, key=lambda i: (margins[i] if margins[i] is not None else float("inf"), i))[:width]
    branches = []
    for at in sorted(chosen):
        first = block.runner_up[at]
        more = drafter.draft_branch(len(block.tokens) - at, first, branch_len - 1) if branch_len > 1 else []
        branches.append((at, [first, *more]))
    return replace(block, branches=tuple(branches))
