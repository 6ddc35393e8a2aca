"""Drafted blocks in flight sized by the link (``edge.link_windows.drafting_window_for``): where the caller
gives the adaptive schedule no cap, the controller weighs as many blocks in flight as the cloud verifies
in a round trip, at least ``DEFAULT_WINDOW``, within the verifier's limit; a cap the caller gives stays
the cap. The output is the target's either way."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import tiny_prompt

from edge.controller import controller_for
from edge.decode_loop import run_decode
from edge.link_windows import drafting_window_for
from edge.schedule import SpecConfig
from edge.verifier_protocol import LinkHint, SessionTerms
from shared.params import DEFAULT_WINDOW, Mode, SamplingParams, window_for
from shared.wire import StreamHints
from sim.inprocess import LocalVerifier, generate


def test_the_drafting_window_covers_a_round_trip_at_the_cloud_s_pace():
    assert drafting_window_for(0.62, 0.047) == 14  # satellite here: ceil(13.2)
    assert drafting_window_for(0.6, 0.05) == 12
    assert drafting_window_for(0.12, 0.047) == DEFAULT_WINDOW == 4  # acespec-50k: ceil(2.6), four at least
    assert drafting_window_for(0.3, 0.05) == 6
    for unknown in ((None, 0.05), (0.6, None), (0.0, 0.05), (0.6, 0.0)):
        assert drafting_window_for(*unknown) == DEFAULT_WINDOW


def _terms(max_blocks_in_flight: int) -> SessionTerms:
    return SessionTerms(max_draft_len=8, max_branches=0, row_tile=1, max_blocks_in_flight=max_blocks_in_flight)


def _started(window: int | None, round_trip_s: float, token_s: float):
    """An adaptive controller started as a pipelined session's is (its verifier decodes ahead, so it drafts
    from the start: ``Controller.start``)."""
    controller = controller_for("adaptive", 8, window)
    controller.expect_ahead(32)
    assert controller.start(round_trip_s, token_s) is None
    return controller


def test_a_controller_with_no_cap_takes_the_link_s_and_the_verifier_bounds_it():
    assert controller_for("adaptive", 8, None).window == DEFAULT_WINDOW  # (no round trip known: without a hint)
    sized = _started(None, 0.6, 0.05)
    assert sized.window == sized.drafting_window == 12  # the whole window from the start
    assert sized.adopt(_terms(16), 8, 0, 3).window == 12
    bounded = _started(None, 0.6, 0.05)
    assert bounded.adopt(_terms(10), 8, 0, 3).window == 10  # the verifier's limit
    assert _started(None, 0.12, 0.047).window == 4
    # The hint errs high (its trip carries the stream's headers; a block costs more than a token): the
    # controller lowers the cap on its own measurements of the network's share of a trip and a block's
    # forward, and never raises it past the start's.
    hinted = _started(None, 0.184, 0.045)
    assert hinted.window == 5  # acespec-50k's hint once the cloud has measured its pace
    hinted.network_s.add(0.12)
    hinted.forward_s.add(0.055)
    hinted.plan()
    assert hinted.window == 4
    far = _started(None, 0.62, 0.047)
    far.network_s.add(0.61)
    far.forward_s.add(0.055)
    far.plan()
    assert far.window == 12
    far.network_s.value = 2.0  # (a stall: the estimate rises)
    far.plan()
    assert far.window == 12
    capped = _started(4, 0.62, 0.047)
    capped.network_s.add(0.05)
    capped.forward_s.add(0.055)
    capped.plan()
    assert capped.window == 4  # (a caller's cap is left alone)
    for cap in (2, 4, 12):  # a cap the caller gives is the cap, whatever the link
        capped = _started(cap, 0.6, 0.05)
        assert capped.window == cap and capped.adopt(_terms(16), 8, 0, 3).window == cap
    assert window_for("adaptive", None) == window_for("pipelined", None) == DEFAULT_WINDOW
    assert window_for("lockstep", None) == 1


class _Counting(LocalVerifier):
    """Counts the most drafted blocks in flight at once (sent, not yet answered)."""

    def __init__(self, engine, link_hint) -> None:
        super().__init__(engine, link_hint=link_hint)
        self.in_flight = self.most = 0

    def send(self, epoch, start_position, block, more_follows, *, empty_blocks=1):
        super().send(epoch, start_position, block, more_follows, empty_blocks=empty_blocks)
        self.in_flight += empty_blocks
        self.most = max(self.most, self.in_flight) if block.tokens else self.most

    def receive(self):
        received = super().receive()
        if not received.verdict.unasked:
            self.in_flight -= 1
        return received


@pytest.mark.parametrize("mode", [Mode.GREEDY, Mode.COUPLED])
def test_a_long_link_keeps_more_drafted_blocks_in_flight_and_changes_no_token(tiny_engine, drafters, mode):
    """A drafter that is always right, on a hinted 0.6 s link with a 50 ms cloud token: with no cap the
    session starts with up to twelve drafted blocks in flight (``drafting_window_for`` the hint; this
    in-process link then measures no round trip to cover, and the controller lowers it to four); with the
    old default cap of four, four. Token-identical to target-only both ways."""
    drafter = drafters["drafter_f32"]
    prompt = tiny_prompt(tiny_engine, "It was the best of times")
    params = SamplingParams(mode=mode, temperature=0.8, seed=3)
    want = generate(tiny_engine, drafter, prompt, params, max_new_tokens=64, spec=SpecConfig(0)).tokens
    hint = LinkHint(0.6, StreamHints(token_s=0.05, max_blocks_in_flight=16))
    most = {}
    for cap in (None, 4):
        link = _Counting(tiny_engine, hint)
        spec = replace(SpecConfig(2, window=window_for("adaptive", cap)), controller=controller_for("adaptive", 2, cap))
        got = run_decode(drafter, link, prompt, params, max_new_tokens=64, spec=spec)
        assert got.tokens == want, cap
        most[cap] = link.most
    assert most[4] <= 4 < most[None] <= 12, most
