"""How far the controller's predictions for drafting hold: the tokens a session committed while it drafted
against the tokens its plans promised over the same seconds.

The controller predicts drafting's pace from a closed-form model of a chain (``shared.acceptance``) fed
with its estimates; the cloud alone's pace it measures directly (``Controller.cloud_s_per_token``). Where
the model is off, the two are not weighed alike: measured on an AMD EPYC (acespec-50k, the q2_k rung on
stem #143, docs/results/2026-12-07-late-block-deadline-epyc), the plans promised 10.9-12.2 tok/s for
drafting against 9.4-10.9 for the cloud alone, the session realised 9.2 while drafting, and it never
switched. ``PaceCheck`` keeps the ratio of what drafting realised to what it was promised, and the
controller scales its drafting predictions by it before weighing them against the cloud alone. Pure
arithmetic: the decode loop reports tokens and seconds between plans (``Controller.observe_pace``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PaceCheck"]


@dataclass
class PaceCheck:
    """Tokens committed while drafting (``realised``) against the tokens promised for the same seconds
    (``promised``: each period's seconds times the pace the plan in force predicted, ``rate``).
    ``prior_tokens``: pseudo-tokens at a ratio of 1 (the model taken at its word until the session has
    drafted about that many tokens)."""

    prior_tokens: float
    rate: float | None = None  # the pace the plan in force promised (None: not drafting, or no prediction)
    promised: float = 0.0
    realised: float = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        """``tokens`` committed over ``seconds`` under the plan in force (counted where it drafted with a
        prediction)."""
        if self.rate is not None and seconds > 0:
            self.promised += self.rate * seconds
            self.realised += tokens

    @property
    def factor(self) -> float:
        """Realised over promised, shrunk to 1 by ``prior_tokens``: what drafting's predictions are scaled by."""
        return (self.realised + self.prior_tokens) / (self.promised + self.prior_tokens)
