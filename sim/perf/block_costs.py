"""The block simulation's records (``sim.perf.block_sim``): what a block costs, a simulated block, the totals."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["BlockCosts", "SimBlock", "SimulatedRun"]


@dataclass(frozen=True)
class BlockCosts:
    """What a block costs where, in seconds (``up_s``: its Draft frame up, by drafts it holds)."""

    alpha: list[float]  # conditional acceptance per position in a block (the last repeats)
    draft_s: float  # the drafter, per drafted token (guesses included)
    up_s: Callable[[int], float]
    rtt_s: float
    down_s: float  # a Verdict frame down
    forward_s: Callable[[int], float]  # a forward over this many rows (the drafts verified, one more; 1: a token alone)
    stale_decode_s: float  # a stale block's forward (its token, after the rebased drafts it verifies)
    rebased_per_stale_decode: float = 0.0  # rebased drafts such a forward accepts, on average
    decode_stale: bool = True  # False: a verifier run with --stale-blocks drop answers stale blocks empty
    token_guessed: float | None = None  # P(a guess of a token decoded for a stale block is right); None: alpha[0]
    early_drafts: int = 0  # drafts of the early block (0: none)
    stale_decode_overruns: bool = False  # a stale decode may run past the next block's due time where that pays (greedy, coupled)
    guess_trials: bool = False  # a controller counts a live block's guesses of stale decodes as acceptance trials (same modes)


@dataclass
class SimulatedRun:
    """Totals over the simulated generations, each from its first token to its last."""

    generations: int = 1
    tokens: int = 0  # tokens committed after each first one
    seconds: float = 0.0  # the edge's time for them
    cloud_s: float = 0.0  # the cloud's forwards
    verdicts: int = 0  # stale ones included
    stale: int = 0
    sent: int = 0  # blocks sent
    sent_drafts: int = 0  # drafts they held (guesses included)
    guessing: int = 0  # a chain's first blocks drafted on guesses
    guesses_held: int = 0  # ... that were verified
    guesses: int = 0  # sent_drafts that were guesses
    empty: int = 0  # blocks sent empty (the cloud decoding alone)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class SimBlock:
    """A simulated block (an ``edge.pipeline.Flight``) with its times at the cloud."""

    chain: int  # the chain it was drafted in (a correction or a wrong guess starts the next)
    drafts: int  # drafts for the chain's positions
    guesses: int  # guesses of the tokens the void blocks in flight bring (a chain's first block)
    opens_chain: bool  # a chain's first block
    more_follows: bool
    sent_at: float
    at_cloud: float
    start_position: int = 0  # counted from the first generated token
    size: int = 0  # drafts and guesses as sent
    verdict_at: float = math.inf
    committed: int = 0
    accepted: int = 0
    forward_s: float = 0.0  # the forward that answered it (0: answered without one)
    forward_rows: int = 0  # ... its rows
    done_at: float = 0.0  # ... its end at the cloud
    ends_chain: bool = False  # a correction
    stale: bool = False
    mismatch: bool = False  # a token decoded for it, guessed wrong by chains drafted before its verdict was read
    void: bool = False  # the edge's view: drafted past a token the verifier will not commit
    early: bool = False  # the early block
    judged: int = 0  # its guesses judged by tokens decoded for stale blocks (a chain's first block)
    guess_wrong: bool = False  # the early block, drafted on a wrong guess of the first token
    first: bool = False  # (the first position, answered with the Opened, is not simulated)

    @property
    def empty(self) -> bool:
        """Sent with no drafts: it asks the cloud for one token (the cloud decoding alone)."""
        return self.drafts == 0 and self.guesses == 0
