"""What the verifier answers for one block, independent of the transport."""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence
from dataclasses import dataclass

__all__ = ["StopReason", "Verdict", "end_within", "stale_forward_ran", "token_follows"]


class StopReason(str, enum.Enum):
    NONE = "none"
    EOS = "eos"  # an end-of-sequence token was committed
    LENGTH = "length"  # max_new_tokens reached
    STOP = "stop"  # the edge's caller stopped it (a stop string, a cancelled request); never on the wire


@dataclass(frozen=True)
class Verdict:
    """The cloud's answer to a block drafted at ``start_position`` in ``epoch``.

    The first ``accepted`` drafts are committed, then ``token``: a correction,
    or a bonus when every draft was accepted. ``token`` is None when the block
    ended the generation at an EOS or the token limit, or when every draft was
    accepted in a block sent with ``more_follows`` (the next block's first
    draft is checked against the distribution the bonus would come from).

    A taken hedge (``branch`` > 0, 1-based): the correction at ``accepted``
    was that branch's first token, and its next ``branch_accepted`` tokens
    were accepted too; ``token`` follows them.

    ``stale``: the block could not be verified (drafted past a token the
    verifier did not commit) and its drafts are void. ``token``, when set, is
    the next token the cloud decoded for it because it had no usable block
    (``accepted`` 0, ``bonus``): a rejection costs the cloud no idle round
    trip. ``rebased``: drafts the edge had sent for the positions from
    ``start_position`` on (drafted past the correction), which that forward
    verified where they lie and accepted; they come before ``token``, which
    is at ``start_position + len(rebased)`` (``rebased_verified``: how many it
    verified, accepted or not). On the verdict of an empty block (the cloud
    decoding alone) ``rebased`` are drafts the cloud proposed itself from the
    committed tokens and accepted, before ``token`` in the same way.
    ``draft_limit``: the verifier lowered the session's drafts per block
    (guesses included) to this, for its blocks of every later epoch (its
    client's rows commit next to nothing); 0 leaves the limit as opened.
    ``ahead``: the first tokens it commits the cloud decoded on its own before
    the block came (``cloud.decode_ahead``): a verified block's first drafts
    matched them (counted in ``accepted``); on any other verdict they lead
    ``rebased``. Every block sent gets exactly one verdict, but for
    ``unasked``: a final verdict that answers none, telling the tokens decoded
    ahead once they ended the session (``Open.takes_unasked_end``).
    """

    epoch: int
    start_position: int
    accepted: int
    token: int | None
    bonus: bool
    done: bool
    stop_reason: StopReason = StopReason.NONE
    branch: int = 0
    branch_accepted: int = 0
    stale: bool = False
    rebased: tuple[int, ...] = ()
    rebased_verified: int = 0  # drafts that forward verified (``rebased`` are those it accepted)
    draft_limit: int = 0  # the session's drafts per block from now on, when the verifier lowered it (0: as opened)
    ahead: int = 0  # of the tokens it commits, the first ones the cloud decoded before the block came (``Open.takes_ahead``)
    unasked: bool = False  # a final verdict that answers no block (``Open.takes_unasked_end``)

    @property
    def is_correction(self) -> bool:
        """A draft was rejected: ``token`` (or a taken branch) replaces it, and everything drafted
        past it is void."""
        return self.branch > 0 or (self.token is not None and not self.bonus)

    @property
    def is_deferred(self) -> bool:
        """Every draft accepted and the bonus left to the next block (``Draft.more_follows``)."""
        return self.token is None and not self.done and not self.stale

    @property
    def committed_count(self) -> int:
        """Tokens this verdict appends: accepted drafts, a taken branch's tokens, rebased drafts (or the
        cloud's proposals) and its token (``committed`` lists them)."""
        return (self.accepted + len(self.rebased) + (1 + self.branch_accepted if self.branch else 0)
                + (self.token is not None))

    def committed(self, drafts, branches=()) -> list[int]:
        """The tokens this verdict appends to the sequence (``branches``: the block's, as
        (at, tokens) pairs, when it had any), the drafts from ``start_position`` on."""
        if self.stale or not drafts:  # (an empty block's: the cloud's own proposals, then its token)
            return [int(t) for t in self.rebased] + ([] if self.token is None else [int(self.token)])
        out = [int(t) for t in drafts[: self.accepted]]
        if self.branch:
            out += [int(t) for t in branches[self.branch - 1][1][: 1 + self.branch_accepted]]
        if self.token is not None:
            out.append(int(self.token))
        return out


def stale_forward_ran(committed: int, ahead: int) -> bool:
    """Whether the verifier ran a forward for a stale block whose verdict commits ``committed`` tokens, the
    first ``ahead`` of them decoded ahead, before the block came: not when it commits none (dropped) or
    only tokens decoded ahead (their forwards were not this block's)."""
    return committed > ahead


def token_follows(accepted: int, drafts: int, more_follows: bool) -> bool:
    """Whether verifying a block of ``drafts`` drafts of which ``accepted`` were accepted commits a token
    after them: a correction, or a bonus unless the block was sent with ``more_follows`` (the bonus is
    deferred to the next block, whose first draft is checked against its distribution). Before any end
    (EOS, the token limit) cuts the block."""
    return accepted < drafts or not more_follows


def end_within(tokens: Sequence[int], eos_ids: Collection[int], room: int) -> tuple[int, StopReason]:
    """How many of ``tokens`` (about to be committed, in order) a generation with ``room`` more tokens
    allowed keeps, and why it ends there: at the first EOS (kept), else at the token limit, else
    (``StopReason.NONE``) all of them."""
    for i, token in enumerate(tokens):
        if token in eos_ids:
            return i + 1, StopReason.EOS
        if i + 1 >= room:
            return i + 1, StopReason.LENGTH
    return len(tokens), StopReason.NONE
