"""A draft block as the edge sent it, and what no honest edge sends.

``PendingBlock`` is a block waiting for verification; ``check_request`` refuses
a prompt and token budget the target cannot take; ``check_block`` refuses
one that breaks the protocol (an epoch ahead, a position outside the session's,
too many drafts, malformed branches) with ``BlockRejected``; ``usable`` says
whether a block is verified or answered stale; ``shares_forward``
says which pending blocks one forward verifies; ``ForgedDraft`` is
the refusal of rejection-mode drafts not sampled from their q̃. The helpers cut
a block to the drafts past the committed tokens and key drafts by position.
Pure: no model, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shared.sparse import SparseDist
from shared.verdict import Verdict

__all__ = ["PendingBlock", "BlockRejected", "ForgedDraft", "MAX_BRANCH_LEN", "check_block", "past", "rebased_verdict",
           "past_correction", "by_position", "check_request",
           "shares_forward", "usable"]

# Tokens a hedge branch may hold: a guessed correction and a short continuation (the edge sends 3);
# the bound keeps a block's tree within (1 + max_branches) * this many rows past its drafts.
MAX_BRANCH_LEN = 8


class BlockRejected(ValueError):
    """A block that cannot be verified against this session's state."""


class ForgedDraft(BlockRejected):
    """Rejection-mode drafts that were not sampled from their q̃ (``check``: which audit said so)."""

    def __init__(self, message: str, check: str) -> None:
        super().__init__(message)
        self.check = check  # "unsampled" or "improbable"


@dataclass(frozen=True)
class PendingBlock:
    """A draft block waiting for verification, as the edge sent it."""

    epoch: int
    start_position: int
    drafts: list[int]  # [n]
    q: list[SparseDist] | None = None  # [n] rejection mode
    more_follows: bool = False
    branches: tuple[tuple[int, list[int]], ...] = ()  # hedges: (index of the draft replaced, tokens)
    arrived_at: float = 0.0  # time.perf_counter() when its frame arrived (0: not timed)


def check_block(block: PendingBlock, *, epoch: int, first: int, last: int, max_draft_len: int,
                max_branches: int) -> None:
    """Refuse a block no honest edge sends to a session at ``epoch`` whose positions run ``first..last``
    (whether it is usable is the session's question: ``VerifierSession._overlap``)."""
    if block.epoch > epoch:
        raise BlockRejected(f"block epoch {block.epoch} is ahead of the session's epoch {epoch}")
    if not first <= block.start_position <= last:
        raise BlockRejected(f"block starts at position {block.start_position}, outside the session's "
                            f"{first}..{last}")
    if len(block.drafts) > max_draft_len:
        raise BlockRejected(f"block of {len(block.drafts)} drafts exceeds the limit of {max_draft_len}")
    if block.more_follows and not block.drafts:
        raise BlockRejected("an empty block cannot be continued (more_follows)")
    if block.branches:
        at = [index for index, _ in block.branches]
        if len(block.branches) > max_branches:
            raise BlockRejected(f"a block with {len(block.branches)} branches exceeds the limit of {max_branches}")
        if block.q is not None:
            raise BlockRejected("hedge branches are for greedy and coupled modes, not rejection mode")
        if len(set(at)) != len(at) or not all(0 <= i < len(block.drafts) for i in at):
            raise BlockRejected(f"branches must hang on distinct drafts of the block (0..{len(block.drafts) - 1}), got {at}")
        longest = min(max_draft_len, MAX_BRANCH_LEN)
        if any(not 1 <= len(tokens) <= longest for _, tokens in block.branches):
            raise BlockRejected(f"a branch must hold 1 to {longest} tokens")


def usable(*, same_epoch: bool, empty: bool, drafts_continue: bool) -> bool:
    """Whether a pending block is verified, else answered stale: it is of the session's epoch, and it is
    empty (it asks for the next token wherever that is) or its drafts continue the committed tokens
    (``shared.wire.committed_skip``). The session decides it on tokens; the verifier simulator on its
    chains, which stand for epochs."""
    return same_epoch and (empty or drafts_continue)


def past(block: PendingBlock, skip: int) -> PendingBlock:
    """``block`` without its first ``skip`` drafts (the committed tokens hold them), its branches on
    them dropped."""
    if not skip:
        return block
    return PendingBlock(
        block.epoch, block.start_position + skip, block.drafts[skip:], block.q and block.q[skip:], block.more_follows,
        tuple((at - skip, tokens) for at, tokens in block.branches if at >= skip), block.arrived_at,
    )


def rebased_verdict(verdict: Verdict, epoch: int, drafts: list[int], *, stale: bool = True) -> Verdict:
    """The verdict of a block of ``epoch`` whose forward verified ``drafts`` that were not its own, from
    that forward's verdict: the accepted drafts ride as ``rebased``, then the token (correction or bonus
    alike). A stale block's (``stale``: its own drafts are void; these are spare ones where they lie),
    or an empty block's (the cloud decoding alone; these are its own proposals)."""
    return Verdict(epoch, verdict.start_position, 0, verdict.token, verdict.token is not None, verdict.done,
                   verdict.stop_reason, stale=stale, rebased=tuple(drafts[: verdict.accepted]),
                   rebased_verified=len(drafts))


def past_correction(block: PendingBlock, verdict: Verdict) -> dict[int, int]:
    """The drafts of ``block`` past the one ``verdict`` corrected (none when it corrected none, or took a
    branch), by position: spare drafts for the stale blocks' forwards."""
    if not verdict.is_correction or verdict.branch:
        return {}
    first = verdict.accepted + 1
    return by_position(block.start_position + first, block.drafts[first:])


def by_position(start: int, drafts: list[int]) -> dict[int, int]:
    """``drafts`` keyed by their absolute positions, the first at ``start``."""
    return dict(zip(range(start, start + len(drafts)), drafts))


def check_request(vocab_size: int, max_positions: int | None, prompt: Sequence[int], max_new_tokens: int) -> None:
    """Refuse (``ValueError``) a prompt and token budget a target of ``vocab_size`` tokens and
    ``max_positions`` positions (None or 0: unbounded) cannot take."""
    if not prompt:
        raise ValueError("prompt must hold at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt token {bad[0]} is outside the vocabulary of {vocab_size}")
    if max_positions and len(prompt) + max_new_tokens > max_positions:
        raise ValueError(
            f"a prompt of {len(prompt)} tokens plus {max_new_tokens} new ones exceeds the target's context of "
            f"{max_positions} positions"
        )


def shares_forward(previous_more_follows: bool, previous_end: int, epoch: int, block_start: int, block_epoch: int) -> bool:
    """Whether a pending block joins the forward of the block before it (a chain verified in one
    forward): that one was sent with ``more_follows`` and ends at ``previous_end``, and this one is of
    the session's ``epoch`` and starts there. The verifier and its model both gather chains so."""
    return previous_more_follows and block_epoch == epoch and block_start == previous_end
