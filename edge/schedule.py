"""A session's schedule: drafts per block and blocks in flight, fixed or chosen by measurement.

Two kinds share one interface (``Schedule``): ``FixedSchedule`` (lock-step
and pipelined: the caller's draft length and window, within the verifier's
terms) and ``edge.controller.Controller`` (adaptive: it measures what each
verdict says and chooses again at the pipeline's re-plan points). The pipeline
(``edge.pipeline``), the decode loop and the performance model speak to either
alike: the schedule adopts the verifier's terms itself (``adopt``,
``lower_draft_limit``), plans, and is fed what verdicts measure (a fixed one
ignores it). Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from edge.controller import Controller, Plan
from edge.link_windows import CLOUD_WINDOW
from edge.verifier_protocol import SessionTerms

__all__ = ["Schedule", "FixedSchedule", "SpecConfig"]


class Schedule(Protocol):
    """What the pipeline and the decode loop ask of a schedule."""

    draft_len: int  # drafts per block now (0: the cloud decodes alone)
    switches: int  # switches between drafting and the cloud alone so far

    @property
    def hedge_width(self) -> int:
        """Hedge branches for the next block."""

    def expect_ahead(self, held_limit: int) -> None:
        """The verifier may decode ahead after a correction, ``held_limit`` tokens held at most (0: not)."""

    def start(self, round_trip_s: float, token_s: float) -> Plan | None:
        """Before the Open: a plan to start with the cloud alone, or None."""

    def adopt(self, terms: SessionTerms, draft_len_cap: int, hedge_cap: int, branch_len: int) -> Plan:
        """Fit to the verifier's ``terms`` (the caller's caps on drafts per block and hedge branches,
        ``branch_len`` tokens a branch); the plan the session follows from now."""

    def lower_draft_limit(self, limit: int, branch_len: int) -> None:
        """The verifier lowered the drafts per block (guesses included) to ``limit``."""

    def plan(self, drafting_only: bool = False, tokens_left: int | None = None) -> Plan:
        """The choice for the next chain (``drafting_only``: within a chain; ``tokens_left``: what the
        token limit leaves, None: unbounded)."""

    def shadow_due(self, since_plan: int) -> bool:
        """In a cloud stretch, ``since_plan`` tokens since the last plan: whether the drafter's would-be
        proposal for the token just decoded is measured."""

    def describe(self, plan: Plan) -> str:
        """One line for a debug log ('' when there is nothing to say)."""

    def observe_block(self, drafted: int, accepted: int, trip_s: float, draft_s: float, cloud_s: float = 0.0,
                      forward_s: float = 0.0, first: int = 0) -> None: ...
    def observe_hedge(self, gained: int, hedge_s: float) -> None: ...
    def observe_forward(self, rows: int, seconds: float) -> None: ...
    def observe_acceptance(self, drafted: int, accepted: int, first: int = 0) -> None: ...
    def observe_stale(self, committed: int, rebased: int = 0, forward_s: float = 0.0, *, trip_s: float | None = None,
                      cloud_s: float = 0.0, drafted: int = 0, draft_s: float = 0.0) -> None: ...
    def observe_cloud_token(self, trip_s: float | None, cloud_s: float, interval_s: float | None,
                            forward_s: float = 0.0, tokens: int = 1) -> None: ...
    def observe_shadow(self, hit: bool, draft_s: float) -> None: ...


class FixedSchedule:
    """The lock-step (``window`` 1) and pipelined schedules: ``draft_len`` drafts a block, ``window`` blocks
    in flight, within the verifier's terms; measurements are ignored. With no drafts (``draft_len`` 0, the
    caller's or the verifier's) the cloud decodes alone: pipelined, ``cloud_window`` empty blocks in flight
    (what the link asks, ``edge.link_windows.cloud_window_for``; ``CLOUD_WINDOW`` where not known), within the
    verifier's ``SessionTerms.empty_in_flight``, as in an adaptive session's cloud stretch (a token a
    forward, as fast as target-only decoding); in lock-step one, a round trip a token."""

    switches = 0

    def __init__(self, draft_len: int, window: int, cloud_window: int = CLOUD_WINDOW) -> None:
        if draft_len < 0 or window < 1:
            raise ValueError(f"need draft_len >= 0 and window >= 1, got {draft_len} and {window}")
        self.draft_len, self.window, self.cloud_window = draft_len, window, cloud_window
        self._hedge_width = 0

    @property
    def hedge_width(self) -> int:
        return self._hedge_width

    def start(self, round_trip_s: float, token_s: float) -> Plan | None:
        return None

    def adopt(self, terms: SessionTerms, draft_len_cap: int, hedge_cap: int, branch_len: int) -> Plan:
        self.draft_len = min(draft_len_cap, terms.max_draft_len)
        self._hedge_width = min(hedge_cap, terms.max_branches)
        if not self.draft_len and self.window > 1:
            self.window = min(self.cloud_window, terms.empty_in_flight)
        else:
            self.window = min(self.window, terms.max_blocks_in_flight)
        return self.plan()

    def lower_draft_limit(self, limit: int, branch_len: int) -> None:
        self.draft_len = min(self.draft_len, limit)

    def plan(self, drafting_only: bool = False, tokens_left: int | None = None) -> Plan:
        return Plan(self.draft_len, self.window, None)

    def shadow_due(self, since_plan: int) -> bool:
        return False

    def describe(self, plan: Plan) -> str:
        return ""

    def observe_block(self, *args, **kwargs) -> None:
        pass

    observe_hedge = observe_forward = observe_acceptance = observe_stale = observe_block
    observe_cloud_token = observe_shadow = expect_ahead = observe_block


@dataclass(frozen=True)
class SpecConfig:
    """How a generation speculates (``edge.decode_loop.run_decode``): ``draft_len`` drafts a block (0:
    target-only decoding), ``window`` blocks in flight at most (1: lock-step; the verifier may allow
    fewer), ``hedge_width`` hedge branches a block (``edge.hedging``; greedy and coupled modes, as many as
    the verifier allows). With a ``controller`` (the adaptive schedule) each chain's draft length and
    window come from it, ``draft_len`` and ``window`` being its caps. ``speculation_cache``: draft a
    correction's next block before its verdict (``edge.speculation_cache``; greedy and coupled modes)."""

    draft_len: int
    window: int = 1
    hedge_width: int = 0
    controller: Controller | None = None
    speculation_cache: bool = False

    def __post_init__(self) -> None:
        if self.draft_len < 0:
            raise ValueError(f"draft length must be >= 0, got {self.draft_len}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.hedge_width < 0:
            raise ValueError(f"hedge width must be >= 0, got {self.hedge_width}")

    def schedule(self) -> Schedule:
        """The schedule a generation follows: the controller, or the fixed draft length and window."""
        return self.controller if self.controller is not None else FixedSchedule(self.draft_len, self.window)
