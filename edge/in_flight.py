"""The decode loop's records of its blocks, and what their tokens say: pure, no I/O.

``Drafting`` is a block being drafted, ``InFlight`` one sent and not yet
answered (an ``edge.pipeline.Flight``). ``guesses_of`` and
``first_live_continues`` read a stale verdict's tokens against the live
chain's drafts; ``branch_gain`` what a taken hedge branch committed;
``describe_verdict`` one answer as the decode loop's debug log tells it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from edge.drafter import DraftBlock
from edge.pipeline import first_live
from shared.verdict import Verdict
from shared.wire import committed_skip

__all__ = ["Drafting", "InFlight", "branch_gain", "describe_verdict", "guesses_of", "first_live_continues"]


@dataclass(frozen=True)
class Drafting:
    """A block being drafted. Drafting stops when a verdict arrives, so that one that voids the
    block ends it at once; otherwise drafting goes on after the verdict is read."""

    start: int  # the position of its first draft
    drafts: int  # the drafts it is to hold
    drafts_left: int  # tokens the limit leaves from ``start``, the correction or bonus aside
    block: DraftBlock = field(default_factory=lambda: DraftBlock([]))  # drafted so far
    draft_s: float = 0.0  # ... in this many seconds
    empty_blocks: int = 1  # an empty block: how many its frame stands for, at consecutive positions
    cached_s: float = 0.0  # of ``draft_s``, the drafting of a speculation cache's branch, done before the block began

    def grown(self, more: DraftBlock, seconds: float) -> Drafting:
        return replace(self, block=self.block.then(more), draft_s=self.draft_s + seconds)

    def continues(self, generated: list[int], prompt_len: int) -> bool:
        """Whether the tokens committed from ``start`` on (``generated`` from ``prompt_len``) are
        drafts of this block (a chain's first block guessed them), or there are none."""
        committed = generated[self.start - prompt_len:]
        return committed == self.block.tokens[:len(committed)]


@dataclass
class InFlight:
    """A block sent and not yet answered (an ``edge.pipeline.Flight``)."""

    epoch: int
    start_position: int
    block: DraftBlock
    more_follows: bool
    sent_at: float = 0.0  # perf_counter at send
    draft_s: float = 0.0  # drafting time of this block's drafts
    hedge_s: float = 0.0  # ... and of its hedge branches
    first: bool = False  # the first position, answered with the Open (not a measurement)
    early: bool = False  # sent before the Opened: its trip spans the prefill (not a measurement)
    void: bool = False  # drafted past a token the verifier did not commit: likely answered stale (any verdict is taken)

    @property
    def size(self) -> int:
        return len(self.block.tokens)

    @property
    def end(self) -> int:
        """The position after the last one this block asks about (an empty block asks for one token)."""
        return self.start_position + max(len(self.block.tokens), 1)


def branch_gain(verdict: Verdict, committed: list[int]) -> int:
    """Tokens a taken hedge branch committed past the correction (0: none taken)."""
    return len(committed) - verdict.accepted - 1 if verdict.branch else 0


def describe_verdict(sent: InFlight, verdict: Verdict, verified: int, committed: list[int], generated: int,
                     in_flight: int) -> str:
    """One line of a session's timeline: which block was answered (its position and drafts, ``verified``
    of them checked past the tokens already committed), how, what it committed (``generated`` before it)
    and the blocks still in flight behind it."""
    kind = ("first token" if sent.first else "empty" if not sent.block.tokens
            else f"{sent.size} drafts" + (f", {verified} verified" if verified != sent.size else ""))
    if verdict.stale:
        how = f"stale, {len(verdict.rebased)} rebased + decode" if committed else "stale, no forward"
    elif not sent.block.tokens:
        how = f"decoded ({len(verdict.rebased)} proposals taken)" if verdict.rebased else "decoded"
    elif verdict.is_correction:
        how = f"{verdict.accepted} accepted, corrected"
    else:
        how = f"{verdict.accepted} accepted, " + ("bonus" if verdict.bonus else "deferred" if verdict.is_deferred else "done")
    if verdict.ahead:
        how += f" ({verdict.ahead} of them decoded ahead)"
    return (f"block @{sent.start_position} ({kind}{', early' if sent.early else ''}): {how}; "
            f"+{len(committed)} -> {generated + len(committed)} tokens, {in_flight} in flight")


def guesses_of(in_flight: Iterable[InFlight], drafting: Drafting | None, position: int,
             tokens: list[int]) -> tuple[int, list[int]] | None:
    """What a chain's first block (the first live one in flight, else the one being drafted) guessed of
    ``tokens``, decoded for a stale block from ``position`` on: (its draft index at ``position``, its
    drafts there, as many as it has of ``tokens``' length). None: there is no such block, or it has
    drafted none there. Those drafts are still its own (it is live): each is a trial of its index, as
    a verdict's would be."""
    live = first_live(in_flight)
    if live is not None:
        start, drafts = live.start_position, live.block.tokens
    elif drafting is not None:
        start, drafts = drafting.start, drafting.block.tokens
    else:
        return None
    guesses = drafts[position - start:][:len(tokens)] if position >= start else []
    return (position - start, guesses) if guesses else None


def first_live_continues(in_flight: Iterable[InFlight], generated: list[int], prompt_len: int) -> bool:
    """Whether the first live block in flight with drafts still continues the committed tokens
    (``generated``, from position ``prompt_len``) as the verifier checks it (``committed_skip``).
    True when there is none."""
    live = first_live(in_flight)
    return live is None or committed_skip(live.start_position, live.block.tokens, generated, prompt_len) is not None
