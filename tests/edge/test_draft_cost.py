"""The price of a drafted token behind prompt lookup: the mixture while the lookup leads, the drafter's own
where it does not, and what that does to the controller's choice."""

from __future__ import annotations

import pytest

from edge.controller import Controller
from edge.draft_cost import DraftCost


def test_looked_up_drafts_are_free_in_the_mixture_and_absent_from_the_drafters_price():
    cost = DraftCost()
    assert cost.value is None
    cost.observe(0.0001, 4, looked_up=4)  # a block the lookup supplied whole
    assert cost.value == pytest.approx(0.000025) and cost.drafter_only.value is None  # (no drafter ran yet)
    cost.observe(0.08, 4, looked_up=2)  # two looked up, two drafted in 80 ms
    assert cost.drafter_only.value == pytest.approx(0.04)
    assert cost.value == pytest.approx(0.04)  # the lookup does not lead: the drafter's own
    cost.observe_lookup(True)
    assert cost.value == pytest.approx(0.8 * 0.000025 + 0.2 * 0.02)  # it leads: the mixture
    cost.observe(1.0, 0)  # nothing drafted: nothing learned
    assert cost.every_draft.value == pytest.approx(0.8 * 0.000025 + 0.2 * 0.02)


def test_a_weak_drafter_after_a_looked_up_start_is_priced_at_its_own_cost():
    """A session's first chain is looked up from the prompt (both sources untried); once the lookup stops
    leading, the controller's prediction for drafting is the drafter's, not the free start's."""
    def after_a_looked_up_start(lookup_leads: bool) -> Controller:
        c = Controller(max_draft_len=8, window=4, cloud_window=16)
        for _ in range(4):
            c.observe_block(drafted=4, accepted=1, trip_s=0.45, draft_s=0.0001, cloud_s=0.25, looked_up=4)
        c.observe_block(drafted=8, accepted=1, trip_s=0.45, draft_s=0.18, cloud_s=0.25)
        c.observe_cloud_token(trip_s=0.25, cloud_s=0.1, interval_s=0.1)
        c.observe_lookup(lookup_leads)
        return c

    leads, drafts = after_a_looked_up_start(True), after_a_looked_up_start(False)
    assert drafts.draft_s_per_token.value == pytest.approx(0.0225)
    assert leads.draft_s_per_token.value < 0.4 * drafts.draft_s_per_token.value
    assert drafts.predict_drafting(8) < leads.predict_drafting(8)
    assert "lookup leads" in leads.describe(leads.plan()) and "lookup leads" not in drafts.describe(drafts.plan())
