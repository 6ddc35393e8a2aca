"""Expected outcomes of verification from per-position acceptance: pure arithmetic.

The edge's controller (``edge.controller``) predicts with these, in closed
form, each time a chain ends; the performance model predicts lock-step rounds
with ``expected_acceptance_length`` and follows pipelined chains block by block
instead (``sim.perf.block_sim``: where stale blocks make many of the tokens, on
a long round trip with a weak drafter, the closed form is optimistic).
``alpha_per_position[i]`` is the conditional acceptance of draft i given drafts
< i accepted; positions past the list reuse its last value.
"""

from __future__ import annotations

import itertools
import math
import operator
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["expected_acceptance_length", "chain_expectation", "stale_expectation", "StaleForecast", "ChainForecast",
           "pipelined_chain", "ChainCosts"]

_MAX_FULL_BLOCK_P = 0.999  # a drafter that is never wrong would make chains endless
_MIN_HOLD_P = 1e-3  # a drafter that is always wrong would make a chain's gaps endless


def expected_acceptance_length(alpha_per_position: list[float], draft_len: int) -> float:
    """AL(D) = 1 + Σ_{i=1..D} Π_{j≤i} α_j: expected tokens committed per round.

    α_j is the conditional acceptance of draft j given drafts < j accepted
    (`DecodeStats.alpha_per_position`). Positions beyond the measured ones
    reuse the last measured α (blocks longer than any measured block are an
    extrapolation). The leading 1 is the correction or bonus token.
    """
    if draft_len < 0:
        raise ValueError(f"draft length must be >= 0, got {draft_len}")
    if draft_len == 0:
        return 1.0
    if not alpha_per_position:
        raise ValueError("alpha_per_position is empty: no acceptance to extrapolate from")
    alphas = [min(max(float(a), 0.0), 1.0) for a in alpha_per_position]
    total, survive = 1.0, 1.0
    for i in range(draft_len):
        survive *= alphas[min(i, len(alphas) - 1)]
        total += survive
    return total


def chain_expectation(alpha_per_position: list[float], draft_len: int) -> tuple[float, float, float]:
    """(blocks, tokens, p_full) of a *chain*: blocks of ``draft_len`` drafts sent with
    ``more_follows`` until the first correction.

    p_full = P(a block is fully accepted) (at most 0.999); a chain holds
    1/(1 - p_full) blocks; it commits D tokens per accepted block, then the
    accepted drafts of the failing block and its correction.
    """
    if draft_len < 1:
        raise ValueError(f"draft length must be >= 1, got {draft_len}")
    if not alpha_per_position:
        raise ValueError("alpha_per_position is empty: no acceptance to extrapolate from")
    alphas = [min(max(float(a), 0.0), 1.0) for a in alpha_per_position]
    reach, tail = 1.0, 0.0  # reach = P(drafts < i accepted); tail = E[accepted in a failing block] * P(fail)
    for i in range(draft_len):
        alpha = alphas[min(i, len(alphas) - 1)]
        tail += i * reach * (1 - alpha)
        reach *= alpha
    p_full = min(reach, _MAX_FULL_BLOCK_P)
    blocks = 1 / (1 - p_full)
    tokens = (blocks - 1) * draft_len + tail / (1 - p_full) + 1
    return blocks, tokens, p_full


class StaleForecast(NamedTuple):
    """What the blocks in flight past a chain's correction add to the chain, on average."""

    forwards: float  # the cloud's forwards for them
    tokens: float  # tokens those forwards commit
    seconds: float  # time the chain waits on top of its own


def stale_expectation(alpha_per_position: list[float], stale_blocks: int, gap_s: float, stale_decode_s: float,
                      rebased_per_stale_decode: float = 0.0, ahead_limit: int = 0) -> StaleForecast:
    """The blocks in flight past a chain's correction are stale: the cloud answers each with
    a token it decodes (``stale_decode_s`` a forward) while the next chain's first block is on its way
    (``gap_s``: the correction down, drafting, the block up), as many as fit, each after the
    ``rebased_per_stale_decode`` drafts sent for those positions that it verifies and accepts where
    they lie, on average. That block's first drafts guess the tokens committed meanwhile: they
    all hold with probability Π α_j over the tokens; else it is stale too: one more forward,
    and a whole gap's wait.

    ``ahead_limit`` > 0: a verifier that decodes ahead (``cloud.decode_ahead``, at most that many
    tokens held) goes on past the stale blocks, a token a forward until the block is due, where the
    block is expected to miss at least as many of those tokens as it holds (its gate:
    Σ 1 − 2·held(k) ≥ 0, held(k) = Π_{j≤k} α_j). Then a missed guess costs no idle gap: the cloud
    decodes on through the next one too, and the chain waits a gap per miss (1/h − 1 of them where
    the guesses hold with probability h), each bringing the missed token and what else fits, up to
    what the first gap told.
    """
    if stale_blocks <= 0:
        return StaleForecast(0.0, 0.0, 0.0)
    fits = math.floor(gap_s / stale_decode_s) if stale_decode_s > 0 else stale_blocks
    decoded = min(stale_blocks, fits)
    per_decode = 1.0 + max(rebased_per_stale_decode, 0.0)
    alphas = [min(max(float(a), 0.0), 1.0) for a in alpha_per_position] or [0.0]
    first = round(decoded * per_decode)  # tokens the stale decodes bring
    ahead = min(max(fits - decoded, 0), ahead_limit)
    held = list(itertools.accumulate((alphas[min(i, len(alphas) - 1)] for i in range(first + ahead)),
                                     operator.mul))  # held[k]: the guesses of tokens 0..k all hold
    if ahead and sum(1 - 2 * held[k] for k in range(first, first + ahead)) < 0:
        ahead = 0  # the block would hold more of them than it misses: the cloud waits for it
    told = first + ahead
    hold = held[told - 1] if told else 1.0
    if not ahead:
        misses = 1 - hold if decoded else 0.0
        return StaleForecast(decoded + misses, (decoded + misses) * per_decode, misses * gap_s)
    retries = (1 - hold) / max(hold, _MIN_HOLD_P)  # gaps waited for a block whose guesses hold
    per_retry = min(1 + told, fits)  # the missed token, then on through the gap
    return StaleForecast(decoded + ahead + retries * per_retry, told + retries * per_retry, retries * gap_s)


@dataclass(frozen=True)
class ChainForecast:
    """One chain of pipelined blocks, from a correction to the next, on average."""

    blocks: float  # blocks verified
    tokens: float  # tokens committed, those the cloud decoded for stale blocks included
    seconds: float


@dataclass(frozen=True)
class ChainCosts:
    """What a chain's blocks cost (``pipelined_chain``): seconds a drafted token, a block's trip less
    the verify, a verify, a forward that decodes for a stale block; the share of stale blocks answered
    with a token, and the drafts accepted before it per such block; the tokens a verifier that decodes
    ahead after a correction holds at most (0: it does not, ``stale_expectation``)."""

    draft_s_per_token: float
    network_s: float
    verify_s: float
    stale_decode_s: float
    stale_share: float = 1.0
    rebased_per_stale_decode: float = 0.0
    ahead_limit: int = 0


def pipelined_chain(alpha_per_position: list[float], draft_len: int, window: int, costs: ChainCosts) -> ChainForecast:
    """A chain of ``draft_len``-draft blocks, ``window`` in flight at most (``chain_expectation``), at ``costs``.

    Its first block costs drafting plus a full trip (``network_s``: uplink, RTT and downlink, plus
    ``verify_s``); every later block adds the pipeline's interval max(draft, verify, (draft + trip)
    / window): the drafter, the verifier and the window each bound how fast blocks flow. The
    blocks in flight past the failing one are stale; ``stale_share`` of them come back with a token
    the cloud decoded (``stale_expectation``, ``stale_decode_s`` a forward, after ``rebased_per_stale_decode`` drafts
    on average; 0: a verifier that answers them empty) while the next chain's first block is on its way:
    those the drafter makes during the failing block's round trip and one more, ``window - 1`` at most.
    """
    draft_s_per_token, network_s, verify_s = costs.draft_s_per_token, costs.network_s, costs.verify_s
    stale_share = costs.stale_share
    blocks, tokens, _ = chain_expectation(alpha_per_position, draft_len)
    draft = draft_len * draft_s_per_token
    trip = network_s + verify_s
    interval = max(draft, verify_s, (draft + trip) / window)
    stale = math.floor(min(window - 1, 1 + trip / max(draft, 1e-9)))  # blocks in flight past the failing one
    redraft = (draft_len + stale) * draft_s_per_token  # the next block: its drafts and a guess per stale block
    gap = network_s + redraft  # the correction down, drafting, the next block up
    stale_part = stale_expectation(alpha_per_position, stale, gap, costs.stale_decode_s, costs.rebased_per_stale_decode,
                                   costs.ahead_limit)
    return ChainForecast(
        blocks=blocks,
        tokens=tokens + stale_share * stale_part.tokens,
        seconds=draft + trip + (blocks - 1) * interval + stale_share * stale_part.seconds,
    )
