"""What a drafted token costs the edge, priced for the chain the controller plans next.

Behind prompt lookup (``edge.lookup_drafter``) a block's drafts come from
two places: the lookup's cost nothing, the drafter's cost what it spends.
Two moving averages are kept: seconds per token over every draft (the
mixture the session has drafted) and over the drafts a drafter ran for.
Which one prices the next chain depends on whether the lookup leads the
drafting now (``LookupFirstDrafter.lookup_pays``): where it does, the mixture
goes on (reasoning and math prompts, whose text keeps recurring, lost 10-17%
when every draft was priced at the drafter's cost); where it does not, the
next chain is the drafter's alone, and free drafts of the past (a session's
first chain, looked up from the prompt while both sources are untried) say
nothing of it. Measured: ``docs/results/2026-12-07-lookup-pricing-epyc``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.stats import Ewma

__all__ = ["DraftCost"]


@dataclass
class DraftCost:
    """Seconds per drafted token: ``value`` prices the next chain's drafts (None before any sample)."""

    every_draft: Ewma = field(default_factory=Ewma)  # over all drafts, looked-up ones at no cost
    drafter_only: Ewma = field(default_factory=Ewma)  # over the drafts a drafter ran for
    lookup_leads: bool = False  # the drafter leads its blocks with a prompt lookup now (``observe_lookup``)

    def observe(self, seconds: float, drafts: int, looked_up: int = 0) -> None:
        """``drafts`` drafted in ``seconds``, ``looked_up`` of them by a prompt lookup (at no cost)."""
        if drafts <= 0:
            return
        self.every_draft.add(seconds / drafts)
        if drafts > looked_up:
            self.drafter_only.add(seconds / (drafts - looked_up))

    def observe_lookup(self, leads: bool) -> None:
        """Whether the drafter's next blocks start with a prompt lookup where one is found."""
        self.lookup_leads = leads

    @property
    def value(self) -> float | None:
        """The price of a drafted token in the next chain: the mixture while the lookup leads (or the
        drafter has not drafted yet), else the drafter's own."""
        if self.lookup_leads or self.drafter_only.value is None:
            return self.every_draft.value
        return self.drafter_only.value
