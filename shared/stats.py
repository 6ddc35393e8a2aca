"""Decode counters: the one set of numbers that feeds logs, metrics and reports."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.verdict import stale_forward_ran

__all__ = ["DecodeStats", "Ewma", "RoundRecord", "percentile"]


def percentile(values, q: float) -> float:
    """The nearest-rank ``q`` quantile (0 <= q <= 1) of a non-empty collection."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Ewma:
    """An exponentially weighted moving average; None until the first sample."""

    weight: float = 0.2  # of each new sample
    value: float | None = None

    def add(self, sample: float) -> None:
        self.value = sample if self.value is None else (1 - self.weight) * self.value + self.weight * sample


@dataclass(frozen=True)
class RoundRecord:
    """One verification round, as every sink (stats, Prometheus, reports) observes it."""

    drafted: int  # drafts in the block
    accepted: int  # drafts accepted
    committed: int  # tokens the round appended (accepted + correction/bonus, fewer at EOS or the limit)
    forwards: int = 1  # target forwards the round cost


@dataclass
class DecodeStats:
    """Counters of one generation (or one service's total).

    ``accepted_at[i]`` counts rounds whose draft i was accepted (vLLM's
    per-position acceptance); its length grows with the longest block seen.
    """

    rounds: int = 0  # verification rounds (one target forward each)
    drafted: int = 0  # draft tokens sent for verification
    accepted: int = 0  # draft tokens accepted
    generated: int = 0  # tokens committed (accepted + corrections + bonuses)
    target_forwards: int = 0  # target forward passes, prefill included
    wall_s: float = 0.0
    accepted_at: list[int] = field(default_factory=list)  # [max D seen]
    drafted_at: list[int] = field(default_factory=list)  # [max D seen]
    corrections_guessed: int = 0  # corrections for which the drafter had a second choice
    corrections_hit: int = 0  # ... and it was the target's correction
    hedges_sent: int = 0  # hedge branches sent with blocks
    hedges_taken: int = 0  # ... whose guessed correction was the target's (the branch was verified on)
    hedge_tokens: int = 0  # tokens taken branches committed past the correction, the final token included (the gain)
    stale: int = 0  # blocks answered stale (drafted past a token the verifier did not commit)
    stale_decoded: int = 0  # ... with a token the verifier decoded meanwhile (a forward each, but after a deferred bonus)
    rebased: int = 0  # ... drafts those forwards verified where they lay and accepted, before that token
    rebased_verified: int = 0  # ... drafts those forwards verified, accepted or not
    proposed: int = 0  # drafts the cloud proposed itself while decoding alone (prompt lookup), verified
    proposed_accepted: int = 0  # ... accepted (committed before the token decoded)
    stale_decode_guesses: int = 0  # stale blocks' tokens (decoded for them) that a chain's first block had guessed
    stale_decode_guesses_hit: int = 0  # ... right (else that block was void: the next one guessed again)
    ahead: int = 0  # tokens the cloud decoded before the block that told them came (``cloud.decode_ahead``)
    restarts: int = 0  # chains begun after a correction (the blocks after it void): a drained pipeline
    restart_draft_s: float = 0.0  # drafting those chains' first blocks: the most a speculation cache could hide
    cache_branches: int = 0  # branches a speculation cache drafted (``edge.speculation_cache``)
    cache_branch_s: float = 0.0  # ... in this many seconds
    cache_hits: int = 0  # ... that a chain's first block took
    cache_drafts: int = 0  # ... drafts those blocks took from them
    cache_hit_s: float = 0.0  # ... drafting time those blocks took from them (hidden from their restarts)
    # Acceptance length per speculative step, as SPEED-Bench and vLLM count it: {length: steps}. A step is a
    # drafted block's verdict; its length, 1 + the drafts it accepted (the target's token counted, also where
    # its bonus was deferred to the next block of its chain, or the generation ended inside the block). The
    # cloud decoding alone takes no step. ``shared.spec_metrics`` reads it.
    accept_lengths: dict[int, int] = field(default_factory=dict)

    def record_round(self, drafted: int, accepted: int, committed: int, chain_continues: bool = False) -> None:
        """One verification round: ``committed`` tokens entered the sequence; ``chain_continues``: its
        block's bonus was deferred to the next block of its chain (``Verdict.is_deferred``)."""
        if drafted:
            self.accept_lengths[accepted + 1] = self.accept_lengths.get(accepted + 1, 0) + 1
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        self.generated += committed
        for counts, n in ((self.drafted_at, drafted), (self.accepted_at, accepted)):
            if len(counts) < drafted:
                counts.extend([0] * (drafted - len(counts)))
            for i in range(n):
                counts[i] += 1

    def record_recovered(self, committed: int) -> None:
        """``committed`` tokens from rounds whose verdicts a broken link lost (the edge learned them
        on resuming): counted as generated, not as rounds, so they do not skew α."""
        self.generated += committed

    def record_stale(self, committed: int, rebased: int = 0, verified: int = 0, ahead: int = 0) -> None:
        """A stale block's verdict, with ``committed`` tokens from the forward the verifier ran for it
        meanwhile (none: no forward): ``rebased`` drafts accepted where they lay (of ``verified``),
        then one decoded; the first ``ahead`` of them decoded ahead, before the block came (all of
        them: no forward of its own)."""
        self.stale += 1
        self.stale_decoded += stale_forward_ran(committed, ahead)
        self.rebased += rebased
        self.rebased_verified += verified
        self.generated += committed

    def record_proposals(self, verified: int, accepted: int) -> None:
        """A forward for the cloud decoding alone verified ``verified`` drafts it proposed itself (in rows
        that cost nothing more) and accepted ``accepted`` of them (counted in ``generated`` by the round)."""
        self.proposed += verified
        self.proposed_accepted += accepted

    def record_stale_decode_guess(self, hit: bool) -> None:
        """Tokens a stale block's verdict brought (decoded for it, after the rebased drafts) at
        positions a chain's first block had drafted guesses for: ``hit``, they were its drafts."""
        self.stale_decode_guesses += 1
        self.stale_decode_guesses_hit += hit

    def record_restart(self, draft_s: float) -> None:
        """A chain's first block after a correction was sent, drafted in ``draft_s`` seconds after the
        verdict that ended the chain before it (the time a block drafted ahead for that correction,
        a speculation cache's, would have saved at most: the verifier decodes stale blocks meanwhile)."""
        self.restarts += 1
        self.restart_draft_s += draft_s

    def record_cache_branch(self, seconds: float) -> None:
        """A speculation cache drafted a branch in ``seconds``."""
        self.cache_branches += 1
        self.cache_branch_s += seconds

    def record_cache_hit(self, drafts: int, seconds: float) -> None:
        """A chain's first block took ``drafts`` drafts from a speculation cache's branch, drafted in ``seconds``
        before the verdict that began the chain."""
        self.cache_hits += 1
        self.cache_drafts += drafts
        self.cache_hit_s += seconds

    def record_correction_guess(self, hit: bool) -> None:
        """A correction the drafter's second choice predicted (``hit``) or not: the hit rate h
        of hedge branches, measured before building them."""
        self.corrections_guessed += 1
        self.corrections_hit += hit

    def record_hedges(self, sent: int, taken: bool, gained: int) -> None:
        """One verdict on a block that carried ``sent`` branches; ``taken``: one was, and
        ``gained`` of its tokens past the correction were committed."""
        self.hedges_sent += sent
        self.hedges_taken += taken
        self.hedge_tokens += gained

    @property
    def correction_hit_rate(self) -> float | None:
        """h: how often the target's correction was the drafter's second choice (None: no corrections)."""
        return self.corrections_hit / self.corrections_guessed if self.corrections_guessed else None

    @property
    def acceptance_rate(self) -> float:
        """α: accepted drafts / drafted tokens (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def acceptance_length(self) -> float:
        """AL: tokens committed per verification round, correction/bonus included."""
        return self.generated / self.rounds if self.rounds else 0.0

    @property
    def alpha_per_position(self) -> list[float]:
        """P(draft i accepted | draft i was sent), per position in the block."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    def to_json(self) -> dict:
        """The counters plus the derived rates (rounded); ``from_json`` reads the counters back."""
        return {
            "rounds": self.rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "generated": self.generated,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "acceptance_length": round(self.acceptance_length, 4),
            "target_forwards": self.target_forwards,
            "wall_s": round(self.wall_s, 4),
            "alpha_per_position": [round(a, 4) for a in self.alpha_per_position],
            "accepted_at": list(self.accepted_at),
            "drafted_at": list(self.drafted_at),
            "corrections_guessed": self.corrections_guessed,
            "corrections_hit": self.corrections_hit,
            "hedges_sent": self.hedges_sent,
            "hedges_taken": self.hedges_taken,
            "hedge_tokens": self.hedge_tokens,
            "stale": self.stale,
            "stale_decoded": self.stale_decoded,
            "rebased": self.rebased,
            "rebased_verified": self.rebased_verified,
            "ahead": self.ahead,
            "proposed": self.proposed,
            "proposed_accepted": self.proposed_accepted,
            "stale_decode_guesses": self.stale_decode_guesses,
            "stale_decode_guesses_hit": self.stale_decode_guesses_hit,
            "restarts": self.restarts,
            "restart_draft_s": round(self.restart_draft_s, 4),
            "cache_branches": self.cache_branches,
            "cache_branch_s": round(self.cache_branch_s, 4),
            "cache_hits": self.cache_hits,
            "cache_drafts": self.cache_drafts,
            "cache_hit_s": round(self.cache_hit_s, 4),
            "accept_lengths": {str(length): steps for length, steps in sorted(self.accept_lengths.items())},
        }

    @classmethod
    def from_json(cls, data: dict) -> DecodeStats:
        fields = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        if "accept_lengths" in fields:  # (JSON keys are strings)
            fields["accept_lengths"] = {int(length): int(steps) for length, steps in fields["accept_lengths"].items()}
        return cls(**fields)
