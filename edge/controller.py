"""The link-aware controller: drafts per block and blocks in flight, or no drafting at all (the cloud
decodes alone), and whether to hedge.

Pure bookkeeping and arithmetic (no I/O, no clock of its own): the decode
loop reports what it measured (``observe_*``) and asks for a ``Plan`` when a
chain ends, or every ``REPLAN_TOKENS`` within one. Moving estimates: α_i per
position (from verdicts, guesses of stale decodes and shadow proposals), the
drafter's seconds per token, the network's share of a block's trip, the
forward alone (``Verdict.forward_us``) for a block and for one token, the
forward's cost by the session's rows in it (``edge.row_cost``: a block is priced
by its rows, so rows the verifier's tile makes free go to longer blocks and
hedge branches, and rows that cost do not), the cloud's seconds per token
decoding alone, and what stale blocks bring back.

Promises: predictions come from ``shared.acceptance`` (closed form); a draft
length is changed only when predicted ``Tunables.change_tie`` faster, and drafting and
the cloud alone swap only on ``Tunables.hysteresis`` and enough acceptance samples;
the window is never above the cap nor below ``Tunables.min_window`` where the cap
allows (never lock-step), the draft length never above the cap or the cloud's
load hint. Whether to hedge is ``edge.hedge_choice``'s (tried, then kept only
while it measurably pays). The rules and their reasons:
``docs/pipelining.md``; how the constants were tuned: ``docs/history.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edge.acceptance_estimate import AcceptanceEstimate
from edge.hedge_choice import HedgeChoice
from edge.link_windows import CLOUD_WINDOW, cloud_window_for, drafting_window_for, stretch_top_up
from edge.row_cost import RowCost
from edge.tunables import TUNABLES, Tunables
from edge.verifier_protocol import SessionTerms
from shared.acceptance import ChainCosts, pipelined_chain
from shared.params import DEFAULT_WINDOW
from shared.stats import Ewma

__all__ = ["Controller", "Plan", "controller_for", "REPLAN_TOKENS"]

REPLAN_TOKENS = 8  # within a cloud stretch or a chain, the decode loop asks for a plan again every this many tokens


def controller_for(schedule: str, max_draft_len: int, window: int | None) -> Controller | None:
    """A controller for the adaptive schedule (None for the fixed ones, or with no drafting at all), its
    window capped at ``window`` (None: at what the link can use, ``drafting_window_for``)."""
    if schedule != "adaptive" or max_draft_len < 1:
        return None
    return Controller(max_draft_len, window or DEFAULT_WINDOW, CLOUD_WINDOW, sized_by_link=window is None)


@dataclass
class StaleBlocks:
    """What the stale blocks past a correction bring back, as measured, and how far the verifier decodes on
    past them (``shared.acceptance.stale_expectation``)."""

    decoded: Ewma = field(default_factory=lambda: Ewma(value=1.0))  # share of stale blocks answered with a token
    rebased: Ewma = field(default_factory=lambda: Ewma(value=0.0))  # ... the rebased drafts accepted before it
    ahead_limit: int = 0  # tokens the verifier may decode ahead after a correction, held at most (0: none)

    def observe(self, committed: int, rebased: int) -> None:
        """A stale block's verdict: ``committed`` tokens decoded for it, ``rebased`` of them drafts accepted."""
        self.decoded.add(float(committed > 0))
        if committed:
            self.rebased.add(rebased)


@dataclass(frozen=True)
class Plan:
    draft_len: int  # drafts per block; 0: the cloud decodes alone (empty blocks)
    window: int  # blocks in flight at most
    predicted_tokens_per_s: float | None  # None before there is anything to predict from


class Controller:
    """Chooses the draft length (0 = cloud decodes alone) and window for the next chain; ``window`` is
    the cap (the caller's, then the verifier's), ``chosen_window`` the choice."""

    def __init__(self, max_draft_len: int, window: int, cloud_window: int, tunables: Tunables = TUNABLES, *,
                 sized_by_link: bool = False) -> None:
        if max_draft_len < 1 or window < 1 or cloud_window < 1:
            raise ValueError("max_draft_len, window and cloud_window must be >= 1")
        self.max_draft_len = max_draft_len
        self.window = window
        # ``sized_by_link``: the cap is what the link can use (``drafting_window_for`` the round trip, at
        # ``start``), not the caller's; ``window`` until then (no link hint: the whole session).
        self.sized_by_link = sized_by_link
        # Empty blocks in flight in a cloud stretch (``stretch_window``): at least, and at most (the verifier's,
        # ``SessionTerms.empty_in_flight``; None before the Open).
        self.stretch_bounds: tuple[int, int | None] = (cloud_window, None)
        self.tunables = tunables
        self.acceptance = AcceptanceEstimate()
        self.draft_s_per_token = Ewma()
        self.network_s = Ewma()  # a block's trip less the cloud's time on it: uplink, RTT, downlink
        self.block_cloud_s = Ewma()  # the cloud's time on a drafted block (its wait behind other blocks included)
        self.forward_s = Ewma()  # the forward that verified a drafted block, alone (unset while the cloud reports none)
        self.forward_cost = RowCost()  # a forward's seconds by the session's rows in it (Verdict.forward_rows)
        self.one_token_s = Ewma()  # a forward that decoded one token (stale block's or alone), alone
        self.cloud_s_per_token = Ewma()  # seconds per token while the cloud decodes alone
        self.stale = StaleBlocks()  # what the stale blocks past a correction bring back
        self.hedge = HedgeChoice()  # hedge branches: the width allowed (``HedgeChoice.allow``) and the choice
        self.drafted_blocks = 0  # drafted blocks observed
        # The current choice. A session starts drafting (measured here: starting with the cloud decoding
        # alone cost the self-drafting Gemma pair 1.47x instead of 2.2x cloud-only on acespec-50k; ``start``
        # says where a round trip outweighs any drafter), the whole window in flight (the stale blocks behind
        # an early correction keep the cloud decoding while the next chain is drafted and on its way:
        # measured against two, docs/history.md), the first plan weighing draft lengths from
        # ``Tunables.start_draft_len``, until the measurements say fewer blocks or other lengths pay.
        self.draft_len = min(max_draft_len, tunables.start_draft_len)
        self.chosen_window = window
        self.switches = 0
        self._shadow_run = 0  # shadow hits in a row since the last miss (``observe_shadow``)

    @classmethod
    def converged(cls, max_draft_len: int, window: int, *, alpha_per_position: list[float], draft_s_per_token: float,
                network_s: float, forward_s: float, cloud_s_per_token: float) -> Controller:
        """A controller that has measured these at length (what it chooses once its estimates have
        settled); it has not chosen yet: ``plan`` starts from where a session does."""
        controller = cls(max_draft_len, window, CLOUD_WINDOW)
        controller.acceptance = AcceptanceEstimate.converged(alpha_per_position)
        for estimate, value in ((controller.draft_s_per_token, draft_s_per_token), (controller.network_s, network_s),
                                (controller.forward_s, forward_s), (controller.cloud_s_per_token, cloud_s_per_token)):
            estimate.value = value
        return controller

    # -- the start -------------------------------------------------------
    def expect_ahead(self, held_limit: int) -> None:
        """Whether the verifier decodes ahead after a correction (``cloud.decode_ahead``: pipelined, greedy
        and coupled modes, ``Open.takes_ahead``), at most ``held_limit`` tokens held (the Open's draft
        limit); 0: it does not. A correction's gap is then priced as the cloud spends it
        (``shared.acceptance.stale_expectation``), and a session never starts with the cloud alone."""
        self.stale.ahead_limit = max(held_limit, 0)

    def start(self, round_trip_s: float, token_s: float) -> Plan | None:
        """Before the Open, from a round trip measured with no cloud work in it and the cloud's hint of
        its seconds per token decoding alone (0: not known): the cloud alone from the first token, where
        the verifier does not decode ahead (``expect_ahead``) and a round trip and a token cost more tokens
        of the cloud's alone than ``Tunables.start_chain_tokens`` (then both seed the estimates, and the
        plan is returned); else None, and the session starts drafting as it would without them. Where
        it decodes ahead, each correction's round trip is spent decoding as the cloud alone would, so
        drafting starts no slower (measured on satellite: docs/history.md). A cap ``sized_by_link`` is set
        here, the session then starting with all of it in flight."""
        if self.sized_by_link:
            self.window = self.chosen_window = drafting_window_for(round_trip_s, token_s)
        if (self.stale.ahead_limit or token_s <= 0 or round_trip_s <= 0
                or (round_trip_s + token_s) / token_s < self.tunables.start_chain_tokens):
            return None
        self.network_s.add(round_trip_s)
        self.cloud_s_per_token.add(token_s)
        self.draft_len = 0
        return Plan(0, self.stretch_window, self.predict_cloud())

    # -- what the loop measured ------------------------------------------
    def observe_block(self, drafted: int, accepted: int, trip_s: float, draft_s: float, cloud_s: float = 0.0,
                      forward_s: float = 0.0, first: int = 0) -> None:
        """A drafted block's verdict: ``accepted`` of ``drafted``, its trip (send to verdict), its
        drafting time, the cloud's time on it (arrival there to verdict, queueing included) and
        the forward's alone (0: not reported). ``first``: the block's draft index of the first draft
        verified (its drafts before it were committed already, as a chain's first block's guesses of
        tokens decoded for stale blocks, which counted as trials of their own indices then)."""
        if drafted <= 0:
            return
        self.drafted_blocks += 1
        self.observe_acceptance(drafted, accepted, first)
        self.draft_s_per_token.add(draft_s / drafted)
        self.block_cloud_s.add(cloud_s)
        _add_reported(self.forward_s, forward_s)
        self.network_s.add(max(trip_s - cloud_s, 0.0))

    def observe_hedge(self, gained: int, hedge_s: float) -> None:
        """A hedged block's verdict (after ``observe_block``, given no forward): ``gained`` tokens its taken
        branch committed past the correction (0: none taken), ``hedge_s`` spent drafting its branches.
        (What its branch rows cost the forward is the row-cost curve's: ``observe_forward``.)"""
        self.hedge.observe(gained, hedge_s)

    def observe_forward(self, rows: int, seconds: float) -> None:
        """A forward that answered a verdict: ``seconds`` alone, holding ``rows`` of the session's rows
        (``Verdict.forward_rows``; 0: not reported, nothing learned)."""
        self.forward_cost.observe(rows, seconds)

    def set_row_tile(self, tile: int) -> None:
        """The rows the verifier's forwards cost alike (``Opened.row_tile``; 0: not said)."""
        self.forward_cost.set_tile(tile)

    def observe_acceptance(self, drafted: int, accepted: int, first: int = 0) -> None:
        """Only what a verdict says of acceptance (for a block whose timings measure something
        else, as the one sent before the Opened, whose trip spans the prefill), or what tokens the
        cloud decoded for stale blocks say of a live block's drafts there: ``accepted`` of
        ``drafted`` drafts in a row, from the block's draft ``first`` on."""
        for i in range(min(accepted + 1, drafted)):  # drafts reached: Bernoulli(α_i) trials until a rejection
            self.acceptance.add(first + i, i < accepted)

    def observe_stale(self, committed: int, rebased: int = 0, forward_s: float = 0.0, *, trip_s: float | None = None,
                      cloud_s: float = 0.0, drafted: int = 0, draft_s: float = 0.0) -> None:
        """A stale block's verdict: ``committed`` tokens the cloud decoded for it, ``rebased`` of them
        drafts sent for those positions that it accepted where they lay (none: empty), in a forward of
        ``forward_s`` (0: not reported); its trip (send to verdict; None: not timed) and the cloud's
        time on it, and its ``drafted`` drafts' drafting time. A drafter whose every chain goes stale
        (a weak one on a long round trip: each chain's first block guessed a token decoded for a void
        block wrong) is thus still measured: without these, drafting could not be predicted, and the
        cloud alone never weighed against it."""
        self.stale.observe(committed, rebased)
        if committed:
            _add_reported(self.one_token_s, forward_s)
        if trip_s is not None:
            self.network_s.add(max(trip_s - cloud_s, 0.0))
        if drafted > 0:
            self.draft_s_per_token.add(draft_s / drafted)

    @property
    def shadow_position(self) -> int:
        """The draft of a block that the next shadow proposal is a trial of (``observe_shadow``)."""
        return self._shadow_run if self.shadows_every_token() else 0

    def observe_shadow(self, hit: bool, draft_s: float) -> None:
        """While the cloud decodes alone: would the drafter have proposed the cloud's token? Where every
        token is shadowed, the proposals read as blocks drafted from the committed tokens: after i hits
        in a row (i < the longest block) a proposal is a trial of draft i, as the block's would be; after
        a miss, or a whole block's hits, of a first draft. A stretch thus measures every position, and a
        drafter handed to the cloud on early bad luck is seen to pay again within tokens, not only
        through its first drafts. Where only some tokens are shadowed, each is a first draft's trial."""
        position = self.shadow_position
        self.acceptance.add(position, hit)
        self._shadow_run = position + 1 if hit and position + 1 < self.max_draft_len else 0
        self.draft_s_per_token.add(draft_s)

    def observe_cloud_token(self, trip_s: float | None, cloud_s: float, interval_s: float | None,
                            forward_s: float = 0.0, tokens: int = 1) -> None:
        """A token the cloud decoded alone (``tokens`` > 1: after others it proposed itself and accepted
        in the same forward): its trip (None: not a measurement, as one sent behind the Open), the
        cloud's time on it (queueing included), the forward's alone (0: not reported) and, in a full
        pipeline, the time since the previous such verdict (the stretch's real rate)."""
        if trip_s is not None:
            self.network_s.add(max(trip_s - cloud_s, 0.0))
        _add_reported(self.one_token_s, forward_s)
        if interval_s is not None:
            self.cloud_s_per_token.add(interval_s / max(tokens, 1))

    def shadows_every_token(self) -> bool:
        """While the cloud decodes alone, whether the drafter can afford a shadow proposal for every
        token (it is well under the cloud's time per token), or only for some."""
        draft, cloud = self.draft_s_per_token.value, self.cloud_s_per_token.value
        return draft is None or cloud is None or draft < 0.5 * cloud

    @property
    def hedge_width(self) -> int:
        """Hedge branches for the next block: the caller's width while hedging (and drafting), else 0."""
        return self.hedge.width(self.draft_len > 0)

    @property
    def drafting_window(self) -> int:
        """Blocks in flight while drafting: the choice, within the cap."""
        return min(self.chosen_window, self.window)

    @property
    def cloud_window(self) -> int:
        """Empty blocks in flight in a cloud stretch, at least (the constructor's)."""
        return self.stretch_bounds[0]

    @property
    def stretch_window(self) -> int:
        """Empty blocks in flight while the cloud decodes alone: what the link as measured asks
        (``cloud_window_for`` the network's share of a trip and the cloud's seconds a token), the
        constructor's window at least, the verifier's cap at most."""
        sized = cloud_window_for(self.network_s.value, self.cloud_s_per_token.value or self.one_token_s.value)
        least, cap = self.stretch_bounds
        window = max(least, sized)
        return window if cap is None else max(min(window, cap), 1)

    def limit_draft_len(self, max_draft_len: int) -> None:
        """The cloud's load hint: no more than this many drafts per block."""
        self.max_draft_len = max(1, min(self.max_draft_len, max_draft_len))
        self.draft_len = min(self.draft_len, self.max_draft_len)

    # -- the verifier's terms (``edge.schedule.Schedule``) ---------------------
    def adopt(self, terms: SessionTerms, draft_len_cap: int, hedge_cap: int, branch_len: int) -> Plan:
        """Fit to the verifier's ``terms``: drafts per block, hedge branches (whether to hedge stays this
        controller's choice), the row tile, blocks in flight. The plan to follow now: the cloud alone
        where it decides so (from the start, or when the link broke), else drafting in its window, the
        first chain's blocks holding the caller's cap until the first plan (a first chain of the start
        length was measured no faster: docs/history.md)."""
        draft_len = min(draft_len_cap, terms.max_draft_len)
        self.limit_draft_len(draft_len)
        self.hedge.allow(min(hedge_cap, terms.max_branches), branch_len)
        self.set_row_tile(terms.row_tile)
        self.window = min(self.window, terms.max_blocks_in_flight)
        self.stretch_bounds = (self.stretch_bounds[0], terms.empty_in_flight)
        if self.draft_len == 0:
            return Plan(0, self.stretch_window, None)
        return Plan(draft_len, self.drafting_window, None)

    def lower_draft_limit(self, limit: int, branch_len: int) -> None:
        """The verifier lowered the drafts per block (guesses included): plan within ``limit``."""
        self.limit_draft_len(limit)
        self.hedge.allow(self.hedge.cap, branch_len)

    def shadow_due(self, since_plan: int) -> bool:
        """In a cloud stretch: every token where the drafter is fast enough, else every ``Tunables.shadow_every``."""
        return self.shadows_every_token() or since_plan % self.tunables.shadow_every == 0

    # -- the choice ------------------------------------------------------
    def predict_drafting(self, draft_len: int, window: int | None = None) -> float | None:
        """Tokens/s of chains of ``draft_len``-draft blocks, ``window`` of them in flight at most (default:
        the cap), or None before the needed measurements."""
        window = window or self.window
        verify = (self.forward_cost.predict(draft_len + 1) or self.forward_s.value or self.block_cloud_s.value
                  or self.cloud_s_per_token.value or self.one_token_s.value)
        alphas = self.acceptance.per_position(draft_len)
        if None in (alphas, self.network_s.value, self.draft_s_per_token.value) or not verify:
            return None
        stale_decode_s = self.cloud_s_per_token.value or self.one_token_s.value or verify
        costs = ChainCosts(self.draft_s_per_token.value, self.network_s.value, verify, stale_decode_s,
                           stale_share=self.stale.decoded.value, rebased_per_stale_decode=self.stale.rebased.value,
                           ahead_limit=self.stale.ahead_limit)
        chain = pipelined_chain(alphas, draft_len, window, costs)
        return chain.tokens / chain.seconds

    def predict_cloud(self) -> float | None:
        """Tokens/s with the cloud decoding alone: one forward a token, the round trip hidden by a
        window of empty blocks (or not, when the window less a top-up, ``stretch_top_up``, is too small
        for the trip). Before a stretch
        of it has been measured, a forward for one token, else for a block, is the price."""
        per_token = (self.cloud_s_per_token.value or self.one_token_s.value or self.forward_s.value
                     or self.block_cloud_s.value)
        if not per_token:
            return None
        rate = 1.0 / per_token
        if self.network_s.value is not None:  # (the fewest in flight: just before a top-up frame goes)
            window = self.stretch_window
            depth = window - stretch_top_up(window, window) + 1
            rate = min(rate, depth / (self.network_s.value + per_token))
        return rate

    def describe(self, plan: Plan) -> str:
        """One line: ``plan`` and the estimates it rests on (for debug logs)."""
        def ms(estimate: Ewma) -> str:
            return "-" if estimate.value is None else f"{estimate.value * 1e3:.0f} ms"

        alphas = self.acceptance.per_position(self.max_draft_len)
        predicted = "-" if plan.predicted_tokens_per_s is None else f"{plan.predicted_tokens_per_s:.2f}"
        cloud = self.predict_cloud()
        return (f"D={plan.draft_len} W={plan.window} predicted {predicted} tok/s (cloud alone "
                f"{'-' if cloud is None else f'{cloud:.2f}'}); α {[round(a, 2) for a in alphas or []]} on "
                f"{self.acceptance.samples} trials, forward {ms(self.forward_s)} ({self.forward_cost.describe()}), "
                f"one token {ms(self.one_token_s)}, "
                f"block at the cloud {ms(self.block_cloud_s)}, network {ms(self.network_s)}, "
                f"drafting {ms(self.draft_s_per_token)}/token, cloud alone {ms(self.cloud_s_per_token)}/token"
                + self.hedge.describe(self.hedge_width, self.hedge_extra_s()))

    def plan(self, drafting_only: bool = False, tokens_left: int | None = None) -> Plan:
        """The choice for the next chain (call when nothing live is in flight: a chain just ended).
        ``drafting_only``: within a chain, only its draft length and window may change (blocks of a
        chain may differ in length; leaving drafting waits for the chain's end). ``tokens_left``: what the
        token limit leaves (None: unbounded); drafting and the cloud alone swap only where the time the
        swap saves over them outweighs what it costs (``swap_pays``)."""
        block_s = self.forward_s.value or self.block_cloud_s.value
        if self.sized_by_link and self.network_s.value is not None and block_s:
            # (The start's cap, from the hint, errs high: lowered on what the session measured.)
            self.window = min(self.window, drafting_window_for(self.network_s.value, block_s))
        # Switching costs a drained pipeline (a round trip) each way: do it on enough evidence only.
        samples = self.acceptance.samples
        settled = self.draft_len != 0 or samples >= self.tunables.min_samples_to_leave_cloud
        # Per draft length, the window predicted best (see _best_window).
        windows = list(range(min(self.tunables.min_window, self.window), self.window + 1))
        chosen = {d: self._best_window(d, windows) if settled else (None, self.drafting_window)
                  for d in range(1, self.max_draft_len + 1)}
        options = {d: value for d, (value, _) in chosen.items()}
        if not drafting_only and (self.draft_len == 0 or options[self.draft_len] is not None):
            options[0] = self.predict_cloud()  # (drafting is left on a prediction for it, not for want of one)
        known = {d: v for d, v in options.items() if v is not None}
        current = known.get(self.draft_len)
        best = max(known.values(), default=0.0)

        def order(d: int) -> tuple[bool, float]:
            """Draft lengths predicted within ``Tunables.change_tie`` of the best first, the longest of them first
            (as fast, with fewer forwards and bytes a token), then the others, the best first."""
            alike = known[d] * (1 + self.tunables.change_tie) >= best
            return alike, d if alike else known[d]

        for choice in sorted(known, key=order, reverse=True):
            if choice == self.draft_len:
                break
            swaps = (choice == 0) != (self.draft_len == 0)
            if swaps and current is not None and not self.swap_pays(current, known[choice], choice, tokens_left):
                continue
            margin = 1 + (self.tunables.hysteresis if swaps else self.tunables.change_tie)
            if choice < self.draft_len:  # on few acceptance samples, only a wide gap makes blocks shorter or none
                evidence = self.tunables.evidence_to_draft_less / max(samples, 1)
                margin *= 1 + (evidence ** 2 if choice == 0 else evidence)
            if current is None or known[choice] > margin * current:
                if swaps:
                    self.switches += 1
                    self._shadow_run = 0  # (a chain ends at a miss: the stretch's first proposal is a first draft)
                self.draft_len = choice
                break
        if self.draft_len:
            self.chosen_window = chosen[self.draft_len][1]
        window = self.stretch_window if self.draft_len == 0 else self.drafting_window
        self.hedge.choose(known.get(self.draft_len), self.forward_cost, self.draft_len, self.tunables.hysteresis,
                          self.drafted_blocks)
        return Plan(self.draft_len, window, known.get(self.draft_len))

    def swap_pays(self, current: float, other: float, draft_len: int, tokens_left: int | None) -> bool:
        """Whether swapping between drafting and the cloud alone (to ``draft_len``; 0: the cloud alone),
        predicted ``other`` tokens/s against ``current``, pays back within ``tokens_left`` tokens (None:
        unbounded, it does). A swap drains the pipeline: one network trip with nothing answered, and, to
        drafting, its first block's drafting as well; the time it saves is ``tokens_left`` at the faster
        rate. (Near the token limit a swap that the rates favour costs more than the rest of the
        generation can win back: measured, a weak drafter's session went back to drafting at 62 of 64
        tokens.)"""
        if tokens_left is None or other <= current:
            return tokens_left is None
        cost = (self.network_s.value or 0.0) + draft_len * (self.draft_s_per_token.value or 0.0)
        return tokens_left * (1.0 / current - 1.0 / other) > cost

    def hedge_extra_s(self) -> float:
        """Seconds a hedged block adds at the current draft length (``HedgeChoice.extra_s``)."""
        return self.hedge.extra_s(self.forward_cost, self.draft_len)

    def _best_window(self, draft_len: int, windows: list[int]) -> tuple[float | None, int]:
        """(predicted tokens/s, window) for ``draft_len``: the best of ``windows``, the largest of those
        predicted within ``Tunables.window_tie`` of it (the current window before any prediction). The
        prediction does not credit what more blocks pending buy a verifier-bound pipeline (the cloud
        verifies the pending chain in one forward): measured, four blocks in flight beat the three
        the arithmetic finds as good."""
        predicted = {w: self.predict_drafting(draft_len, w) for w in windows}
        if None in predicted.values():
            return None, self.drafting_window
        best = max(predicted.values())
        window = max(w for w, v in predicted.items() if v * (1 + self.tunables.window_tie) >= best)
        return predicted[window], window


def _add_reported(estimate: Ewma, seconds: float) -> None:
    """A forward's time, where the cloud reported one (0: an older cloud, or none ran)."""
    if seconds > 0:
        estimate.add(seconds)
