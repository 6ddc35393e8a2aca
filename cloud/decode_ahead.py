"""Decoding ahead: the cloud goes on decoding while the edge's next block is on its way.

After a correction (or a stale block, or a bonus) the edge drafts its next
chain and sends it, a round trip and a block of drafting later. Stale blocks
still in flight are answered with stale decodes (``cloud.next_block``); once
none is left and nothing is pending, the cloud would sit idle until the next
block comes. To an edge that sent ``Open.takes_ahead`` (greedy and coupled
modes) it decodes on instead, one forward a token, as an empty block would
have it (``VerifierSession.verify_chain_steps``), and holds the tokens until
that block comes:

- its first drafts guess them: where they match (a draft there is accepted
  exactly when it is the target's token), the block is verified past them and
  its verdict counts them as accepted drafts;
- where they do not, the block is stale, and its verdict carries them first;
- an empty block's verdict carries them before its own token.

Either way the tokens are the ones the target alone commits: decoding ahead
changes when the edge learns them, never what they are. ``Verdict.ahead`` says
how many of a verdict's tokens came so. A forward cannot be stopped, so one
that would still run when the edge's block is due weighs its overrun as a
stale decode does (``cloud.next_block.decodes_stale``); and the tokens held
never exceed what one verdict may carry (``Opened.max_draft_len``), which
bounds the work an edge that stops sending gets for free. The forwards are the
session's own, charged to its client like any other. A block that starts
inside the tokens held, or carries hedge branches while any are held, is stale
(the edge was not told them; a branch's number would not be the edge's).
"""

from __future__ import annotations

import time
from dataclasses import replace

from cloud.engine import Steps
from cloud.next_block import decodes_stale
from cloud.pending_block import PendingBlock
from shared.params import Mode
from shared.verdict import Verdict

__all__ = ["DecodedAhead", "breaks_chain", "decode_ahead_steps", "decodes_ahead"]


class DecodedAhead:
    """The tokens a session committed on its own since its last verdict (none told to the edge yet)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []

    def __len__(self) -> int:
        return len(self.tokens)

    def told_from(self, committed: int) -> int:
        """The position the edge's last verdict left it at, with ``committed`` tokens in the session."""
        return committed - len(self.tokens)

    def clear(self) -> None:
        """Everything committed is told (a resume's Opened carries it, a new turn starts afresh)."""
        self.tokens = []

    def fold(self, verdict: Verdict, *, verified: bool) -> Verdict:
        """``verdict`` as the edge reads it, the tokens held put in front of what it commits (and
        forgotten): a ``verified`` block's first drafts matched them, and they count as accepted drafts;
        any other verdict (stale, an empty block's) carries them first in ``rebased``, its own
        tokens after them. The verdict then starts where the edge's last one left it."""
        held, self.tokens = self.tokens, []
        if not held:
            return verdict
        start = verdict.start_position - len(held)
        if verified:
            return replace(verdict, start_position=start, accepted=verdict.accepted + len(held), ahead=len(held))
        tokens = [*held, *verdict.rebased, *([] if verdict.token is None else [verdict.token])]
        return replace(verdict, start_position=start, rebased=tuple(tokens[:-1]), token=tokens[-1], bonus=True,
                       rebased_verified=verdict.rebased_verified + len(held), ahead=len(held))


def breaks_chain(verdict: Verdict) -> bool:
    """Whether, after ``verdict``, the edge's next block starts a new chain: nothing it sent continues
    what the cloud committed (a correction, a stale block, a bonus), so the cloud may decode ahead
    until it comes. Not after a deferred verdict (the next block continues the chain) or the last."""
    return not verdict.is_deferred and not verdict.done


def decodes_ahead(session, deadline: float | None) -> bool:
    """Whether ``session`` (a ``VerifierSession``), nothing of its edge pending, decodes its next token
    ahead now: the edge takes them, greedy or coupled mode, the service decodes for stale blocks, the
    session goes on, the tokens held and the forward's spare rows stay within what a verdict may carry,
    and the forward would be over by ``deadline`` (when the edge's next block is due; None: not known)
    or its overrun pays, as for a stale decode."""
    policy = session.policy
    if not (policy.decode_ahead and policy.decode_stale and session.params.mode is not Mode.REJECTION):
        return False
    if session.done or session.broken or session.generated >= session.max_new_tokens:
        return False
    if len(session.ahead) + session.drafts_at_no_cost() + 1 > session.draft_limit.opened:
        return False
    return decodes_stale(enabled=True, usable_behind=False, now=time.perf_counter(),
                         forward_s=session.one_token_s.value or 0.0, deadline=deadline, may_overrun=True,
                         guess_odds=session.guess_odds())


def decode_ahead_steps(session) -> Steps:
    """A ``VerifierSession``'s next token (and its own proposals on the way), decoded as for an empty
    block and held for the edge's next verdict. The step answers no block: it has no verdicts, and its
    tokens are credited to the client when a verdict tells them."""
    step = yield from session.verify_chain_steps([PendingBlock(session.epoch, len(session.tokens), [])])
    (verdict,) = step.verdicts  # (the tokens held before it, folded in front of its own)
    session.ahead.tokens = verdict.committed([])
    return replace(step, verdicts=[], proposals_taken=0)
