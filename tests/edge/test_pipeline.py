"""The edge's protocol core (``edge.pipeline``) by hand, table-driven: where the next block starts and
what it holds, what may follow, what a verdict voids, the hold, how a session starts, and what each
verdict feeds the schedule. The decode loop and the block simulator both drive these rules."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from edge.controller import Controller, Plan
from edge.link_windows import CLOUD_WINDOW
from edge.pipeline import (
    LiveVerdict,
    NextBlock,
    Pipeline,
    StaleVerdict,
    may_follow,
    more_follows,
    observe_stale_verdict,
    observe_verdict,
)
from edge.schedule import FixedSchedule
from edge.verifier_protocol import CloudTiming, SessionTerms


@dataclass
class Block:
    """A block in flight, as the pipeline reads one."""

    start_position: int
    size: int
    more_follows: bool = False
    void: bool = False
    first: bool = False


def pipeline(draft_len: int = 4, window: int = 3, *blocks: Block, draft_limit: int | None = None) -> Pipeline:
    pipe = Pipeline(draft_len, window, FixedSchedule(draft_len, window), draft_limit=draft_limit)
    for block in blocks:
        pipe.sent(block)
    return pipe


# (blocks in flight, committed end, end limit, draft limit) -> the next block (None: wait)
NEXT_BLOCK_CASES = [
    ((), 10, 100, None, NextBlock(10, 4, 0, 89)),  # a new chain at the committed end
    ((Block(10, 4, more_follows=True),), 10, 100, None, NextBlock(14, 4, 0, 85)),  # continues the live chain
    ((Block(10, 4, void=True), Block(14, 4, void=True)), 12, 100, None, NextBlock(12, 6, 2, 87)),  # guesses two
    ((Block(10, 4, void=True),), 12, 100, 3, NextBlock(12, 3, 1, 87)),  # the verifier's limit holds guesses too
    ((), 10, 13, None, NextBlock(10, 2, 0, 2)),  # the limit leaves room for the correction or bonus
    ((Block(10, 2, more_follows=True),), 10, 12, None, None),  # the limit is reached by what is in flight
]


@pytest.mark.parametrize(("blocks", "committed_end", "end_limit", "draft_limit", "want"), NEXT_BLOCK_CASES)
def test_where_the_next_block_starts_and_what_it_holds(blocks, committed_end, end_limit, draft_limit, want):
    assert pipeline(4, 3, *blocks, draft_limit=draft_limit).next_block(committed_end, end_limit) == want


@pytest.mark.parametrize(("blocks", "draft_len", "follows"), [
    ((), 4, True),
    ((Block(10, 4, more_follows=True),), 4, True),
    ((Block(10, 4),), 4, False),  # it asked for a bonus: nothing may be chained on it
    ((Block(10, 4, void=True),), 4, True),  # void: a new chain may go
    ((Block(10, 0),), 0, True),  # the cloud alone: empty blocks follow empty blocks
    ((Block(10, 0),), 4, False),
])
def test_what_may_follow_what_is_in_flight(blocks, draft_len, follows):
    assert may_follow(list(blocks), draft_len) is follows


def test_a_block_may_go_only_within_the_window_and_after_the_first_token():
    assert pipeline(4, 2).may_send()
    assert not pipeline(4, 2, Block(10, 0, first=True)).may_send()  # the first token reaches the caller first
    assert not pipeline(4, 1, Block(10, 4, more_follows=True)).may_send()  # the window is full
    held = pipeline(4, 3, Block(10, 4, more_follows=True))
    held.hold_if(True)
    assert held.hold and not held.may_send()
    assert more_follows(4, 10, 2) and not more_follows(4, 4, 2) and not more_follows(4, 10, 1) and not more_follows(0, 9, 2)


@pytest.mark.parametrize(("correction", "stale", "sent_void", "chain_broken", "voids"), [
    (True, False, False, False, True),  # a correction voids everything in flight
    (False, False, False, False, False),  # accepted: nothing
    (False, True, False, False, True),  # a stale verdict for a block the edge counted on
    (False, True, True, False, False),  # ... for one it already knew was void
    (False, True, True, True, True),  # a token decoded for it broke the live chain's guess
])
def test_what_a_verdict_voids(correction, stale, sent_void, chain_broken, voids):
    pipe = pipeline(4, 3, Block(10, 4, void=sent_void), Block(14, 4, more_follows=True))
    sent = pipe.answered()
    assert pipe.settle(sent, 3, correction=correction, stale=stale, chain_broken=chain_broken) is voids
    assert all(block.void for block in pipe) is voids and pipe.since_plan == 3


def test_a_fixed_schedule_keeps_its_plan_and_fits_the_verifier_s_terms():
    schedule = FixedSchedule(8, 4)
    plan = schedule.adopt(SessionTerms(max_draft_len=5, max_blocks_in_flight=2, max_branches=1), 8, 3, 3)
    assert (plan.draft_len, plan.window, schedule.hedge_width) == (5, 2, 1)
    pipe = Pipeline(5, 2, schedule)
    assert pipe.replan() == plan and pipe.head_start(1.0, 0.01) is None and not pipe.shadow_due()
    schedule.lower_draft_limit(3, 3)
    assert schedule.plan().draft_len == 3
    # Nothing to draft: the cloud decodes alone, as many empty blocks in flight as the verifier allows
    # (a cloud stretch's window), unless the session is lock-step.
    alone = FixedSchedule(0, 4)
    assert alone.adopt(SessionTerms(max_draft_len=5, max_blocks_in_flight=8), 0, 0, 3).window == 8
    assert FixedSchedule(0, 4).adopt(SessionTerms(max_draft_len=5, max_blocks_in_flight=64), 0, 0, 3).window \
        == CLOUD_WINDOW
    assert FixedSchedule(0, 1).adopt(SessionTerms(max_draft_len=5, max_blocks_in_flight=8), 0, 0, 3).window == 1
    # Its window is what the link asks (``cloud_window_for``, from the hint the head start reads), within the
    # verifier's empty blocks in flight (an older verifier's: its blocks in flight).
    pipe = Pipeline(0, 4, FixedSchedule(0, 4))
    assert pipe.head_start(0.61, 0.044) == Plan(0, 43, None) and pipe.cloud_window == 43
    long = SessionTerms(max_draft_len=0, max_blocks_in_flight=16, max_empty_blocks=64)
    assert FixedSchedule(0, 4, pipe.cloud_window).adopt(long, 0, 0, 3).window == 43
    assert FixedSchedule(0, 4, 43).adopt(SessionTerms(max_draft_len=0, max_blocks_in_flight=16), 0, 0, 3).window == 16
    assert FixedSchedule(0, 1, 43).adopt(long, 0, 0, 3).window == 1


def test_a_long_round_trip_starts_an_adaptive_session_with_the_cloud_alone():
    controller = Controller(8, 4, CLOUD_WINDOW)
    pipe = Pipeline(8, 4, controller)
    assert pipe.head_start(0.6, 0.05) is not None  # 13 of the cloud's tokens a round trip
    assert Pipeline(8, 4, Controller(8, 4, CLOUD_WINDOW)).head_start(0.01, 0.05) is None
    # Nothing to draft: the cloud alone from the first token, however short the trip (lock-step: one block).
    assert Pipeline(0, 4, Controller(8, 4, CLOUD_WINDOW)).head_start(0.01, 0.05) == Plan(0, CLOUD_WINDOW, None)
    assert Pipeline(0, 1, Controller(8, 1, CLOUD_WINDOW)).head_start(0.6, 0.05) is None
    assert pipe.takes_early_block(3) and not pipeline(4, 1).takes_early_block(3) and not pipe.takes_early_block(0)


class Recording(FixedSchedule):
    """A fixed schedule that notes what it is fed."""

    def __init__(self) -> None:
        super().__init__(4, 2)
        self.calls: list[tuple] = []

    def __getattribute__(self, name):
        if name.startswith("observe_"):
            return lambda *args, **kwargs: self.calls.append((name, args, kwargs))
        return super().__getattribute__(name)


def test_what_each_verdict_feeds_the_schedule():
    timing = CloudTiming(0.05, 0.04, 5)
    seen = Recording()
    assert not observe_verdict(seen, LiveVerdict(4, 4, 2, 0.3, 0.1, timing))
    assert [c[0] for c in seen.calls] == ["observe_forward", "observe_block"]
    seen.calls.clear()
    assert not observe_verdict(seen, LiveVerdict(4, 4, 4, 0.3, 0.1, timing, early=True))  # acceptance only
    assert [c[0] for c in seen.calls] == ["observe_acceptance"]
    seen.calls.clear()
    assert not observe_verdict(seen, LiveVerdict(4, 4, 4, 0.3, 0.1, timing, early=True, wrong_guess=True))
    assert seen.calls == []  # drafted on a wrong guess of the first token: nothing
    assert observe_verdict(seen, LiveVerdict(0, 0, 0, 0.3, 0.0, timing, tokens=2))  # the cloud alone: shadow due?
    assert [c[0] for c in seen.calls] == ["observe_forward", "observe_cloud_token"]
    seen.calls.clear()
    observe_stale_verdict(seen, StaleVerdict(2, 1, 0.3, timing, 4, 0.1, guess_trials=(1, 2, 1)))
    assert [c[0] for c in seen.calls] == ["observe_acceptance", "observe_forward", "observe_stale"]
    assert seen.calls[0][1:] == ((2, 1), {"first": 1})


def test_a_block_whose_first_drafts_were_committed_counts_its_verified_drafts_at_their_own_indices():
    """A chain's first block guessed two tokens decoded for stale blocks (trials of its drafts 0 and 1,
    counted as those verdicts came); its verdict verifies drafts 2.. and says nothing of draft 0."""
    seen = Recording()
    observe_verdict(seen, LiveVerdict(3, 5, 1, 0.3, 0.1, CloudTiming(0.05, 0.04, 4), skipped=2))
    assert [c[0] for c in seen.calls] == ["observe_forward", "observe_block"]
    assert seen.calls[1][2]["first"] == 2
    controller = Controller(8, 4, CLOUD_WINDOW)
    controller.observe_block(3, 1, 0.3, 0.1, first=2)
    assert controller.acceptance.trials[:2] == [0.0, 0.0] and controller.acceptance.trials[2:4] == [1.0, 1.0]
    assert controller.acceptance.hits[2:4] == [1.0, 0.0]  # draft 2 accepted, draft 3 the first rejected
