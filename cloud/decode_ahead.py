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
session's own, charged to its client like any other.

A token decoded ahead is worth its forward only where the edge's next block
would not have held it: where the block's first drafts match the tokens held,
its forward runs all the same and the edge learns nothing sooner. So the
session learns, from the first block of each new chain (``ChainStartGuesses``),
how far such a block's drafts hold the target's next tokens, and decodes on
only while the tokens that fit before the block is due are expected to be
missed by it at least as often as held (``ChainStartGuesses.pays``): with a
drafter whose guesses hold, the forwards are saved; with one whose guesses
miss, the edge hears of its correction a forward or more sooner. A block that starts
inside the tokens held, or carries hedge branches while any are held, is stale
(the edge was not told them; a branch's number would not be the edge's).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace

from cloud.engine import Steps
from cloud.next_block import decodes_stale
from cloud.pending_block import PendingBlock
from shared.params import Mode
from shared.verdict import StopReason, Verdict

__all__ = ["ChainStartGuesses", "DecodedAhead", "breaks_chain", "decode_ahead_steps", "decodes_ahead"]


class ChainStartGuesses:
    """How far the edge's first block of a new chain guesses the target's next tokens: per draft
    position k, how often draft k matched where drafts 0..k-1 had (Laplace's rule: 1/2 before any)."""

    def __init__(self) -> None:
        self.trials: list[int] = []
        self.hits: list[int] = []

    def observe(self, drafts: Sequence[int], start: int, told: int, tokens: Sequence[int]) -> None:
        """A chain's first block of ``drafts`` from position ``start``, the edge told of the tokens up to
        ``told`` (>= ``start``: its first drafts may guess tokens decoded for stale blocks, told since),
        against the session's committed ``tokens`` (all positions, the prompt's included). Trials are
        counted from ``told`` on, as the tokens decoded ahead are: the drafts there before the first that
        differs are hits, that one a miss (a miss before ``told`` misses there too); drafts past the
        committed tokens are no trial, nor is a block that starts past ``told``."""
        shift = told - start
        if shift < 0:
            return
        known = min(len(drafts), len(tokens) - start) - shift
        matched = 0
        while matched < known + shift and drafts[matched] == tokens[start + matched]:
            matched += 1
        matched = max(matched - shift, 0)
        for k in range(min(matched + 1, known)):
            if k == len(self.trials):
                self.trials.append(0)
                self.hits.append(0)
            self.trials[k] += 1
            self.hits[k] += k < matched

    def held(self, k: int) -> float:
        """The odds that such a block's drafts 0..k all match the target's tokens."""
        odds = 1.0
        for m in range(k + 1):
            trials, hits = (self.trials[m], self.hits[m]) if m < len(self.trials) else (0, 0)
            odds *= (hits + 1) / (trials + 2)
        return odds

    def pays(self, first: int, count: int) -> bool:
        """Whether decoding ahead the tokens at positions ``first`` .. ``first + count - 1`` past the told
        one (``first`` held already, ``count`` >= 1 more fitting before the block is due) is expected to
        bring the edge at least as many tokens its block would have missed (the block is then answered
        without its forward, the tokens told sooner) as forwards spent on tokens its drafts hold (which
        its forward would have settled anyway): sum over them of (1 - held) - held >= 0. A token's
        odds of being held fall with its position, so the later ones are the ones that pay."""
        return sum(1.0 - 2.0 * self.held(k) for k in range(first, first + max(count, 1))) >= 0.0


class DecodedAhead:
    """The tokens a session committed on its own since its last verdict (none told to the edge yet),
    and how well the edge's new chains guess such tokens (``guesses``, kept across turns)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.guesses = ChainStartGuesses()

    def __len__(self) -> int:
        return len(self.tokens)

    def told_from(self, committed: int) -> int:
        """The position the edge's last verdict left it at, with ``committed`` tokens in the session."""
        return committed - len(self.tokens)

    def clear(self) -> None:
        """Everything committed is told (a resume's Opened carries it, a new turn starts afresh)."""
        self.tokens = []

    def end(self, epoch: int, committed: int, stop_reason: StopReason, *, unasked: bool = False) -> Verdict:
        """The final verdict of a session the tokens held ended (``committed`` tokens in it, ``epoch`` its
        edge's): for the edge's next block, or for none (``unasked``, ``Verdict.unasked``). It tells them all."""
        return self.fold(Verdict(epoch, committed, 0, None, False, True, stop_reason, stale=True, unasked=unasked),
                         verified=False)

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
    the tokens that fit before ``deadline`` (when the edge's next block is due; None: not known) are
    worth their forwards (``ChainStartGuesses.pays``) or reach the token limit (for an edge that takes the
    final verdict unasked: it learns them all sooner than any block could tell it), and the forward would
    be over by ``deadline`` or its overrun pays, as for a stale decode."""
    policy = session.policy
    if not (policy.decode_ahead and policy.decode_stale and session.params.mode is not Mode.REJECTION):
        return False
    if session.done or session.broken or session.generated >= session.max_new_tokens:
        return False
    held = len(session.ahead)
    room = session.draft_limit.opened - session.drafts_at_no_cost() - held
    if room < 1:
        return False
    now, forward_s = time.perf_counter(), session.one_token_s.value or 0.0
    fits = min(max(room if deadline is None or forward_s <= 0 else math.ceil((deadline - now) / forward_s), 1), room)
    to_the_end = session.policy.tell_end and session.max_new_tokens - session.generated <= fits
    if not (to_the_end or session.ahead.guesses.pays(held, fits)):
        return False
    return decodes_stale(enabled=True, usable_behind=False, now=now, forward_s=forward_s, deadline=deadline,
                         may_overrun=True, guess_odds=session.guess_odds())


def decode_ahead_steps(session) -> Steps:
    """A ``VerifierSession``'s next token (and its own proposals on the way), decoded as for an empty
    block and held for the edge's next verdict. The step answers no block: it has no verdicts, and its
    tokens are credited to the client when a verdict tells them; but where they end the session and the
    edge takes it (``SessionPolicy.tell_end``), its one verdict is the final one, unasked (``end``)."""
    step = yield from session.verify_chain_steps([PendingBlock(session.epoch, len(session.tokens), [])])
    (verdict,) = step.verdicts  # (the tokens held before it, folded in front of its own)
    session.ahead.tokens = verdict.committed([])
    told = session.done and session.policy.tell_end
    end = [session.ahead.end(session.epoch, len(session.tokens), session.stop_reason, unasked=True)] if told else []
    return replace(step, verdicts=end, proposals_taken=0)
