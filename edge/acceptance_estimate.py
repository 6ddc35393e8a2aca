"""Per-position acceptance, estimated from verdicts with forgetting (``edge.controller``'s α_i)."""

from __future__ import annotations

from edge.tunables import TUNABLES

__all__ = ["AcceptanceEstimate"]


class AcceptanceEstimate:
    """Per-position acceptance α_i (draft i of a block accepted, given drafts < i were), from counts
    that forget: each new trial at a position scales that position's counts by 1 - 1/``memory``.

    A position seldom reached is shrunk toward the pooled rate by ``strength`` pseudo-trials; the
    pooled rate starts from ``prior_weight`` pseudo-trials at ``prior``, which are forgotten like
    any trial (one early rejection reads as about 1/3, not 0). ``samples`` counts every trial added.
    """

    def __init__(self, memory: float = 32.0, strength: float = TUNABLES.shrink_strength, prior: float = 0.5,
                 prior_weight: float = 2.0) -> None:
        self.keep = 1.0 - 1.0 / memory
        self.strength = strength
        self.hits: list[float] = []
        self.trials: list[float] = []
        self.pooled_hits, self.pooled_trials = prior * prior_weight, prior_weight
        self.samples = 0

    @classmethod
    def converged(cls, alpha_per_position: list[float], trials: float = 1e6) -> AcceptanceEstimate:
        """An estimate that has seen ``alpha_per_position`` over many trials (the priors forgotten)."""
        estimate = cls()
        estimate.hits = [a * trials for a in alpha_per_position]
        estimate.trials = [trials] * len(alpha_per_position)
        estimate.pooled_hits, estimate.pooled_trials = sum(estimate.hits), trials * len(alpha_per_position)
        estimate.samples = int(trials)
        return estimate

    def add(self, position: int, hit: bool) -> None:
        while len(self.trials) <= position:
            self.hits.append(0.0)
            self.trials.append(0.0)
        self.hits[position] = self.hits[position] * self.keep + hit
        self.trials[position] = self.trials[position] * self.keep + 1.0
        self.pooled_hits = self.pooled_hits * self.keep + hit
        self.pooled_trials = self.pooled_trials * self.keep + 1.0
        self.samples += 1

    @property
    def pooled(self) -> float | None:
        """All positions together (None before any trial)."""
        if not self.samples:
            return None
        return self.pooled_hits / self.pooled_trials

    def per_position(self, n: int) -> list[float] | None:
        """[α_0 .. α_{n-1}] (None before any trial)."""
        pooled = self.pooled
        if pooled is None:
            return None
        out = []
        for i in range(n):
            hits, trials = (self.hits[i], self.trials[i]) if i < len(self.trials) else (0.0, 0.0)
            out.append((hits + pooled * self.strength) / (trials + self.strength))
        return out
