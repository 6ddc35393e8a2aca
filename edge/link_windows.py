"""How many blocks a session keeps in flight on its link: empty ones while the cloud decodes alone
(``cloud_window_for``, topped up a frame at a time: ``stretch_top_up``) and drafted ones
(``drafting_window_for``). Pure arithmetic on a round trip and the cloud's seconds a token, as the
link hint or the controller's estimates give them; the reasons and measurements: ``docs/pipelining.md``.
"""

from __future__ import annotations

import math

from shared.params import DEFAULT_WINDOW

__all__ = ["CLOUD_WINDOW", "RETRANSMIT_FLOOR_S", "stretch_top_up", "cloud_window_for", "drafting_window_for"]

CLOUD_WINDOW = 16  # empty blocks in flight while the cloud decodes alone, at least (the verifier may allow fewer)
RETRANSMIT_FLOOR_S = 0.2  # TCP resends a lost packet a round trip and at least this later (Linux's least RTO variance)


def stretch_top_up(window: int, max_empty_blocks: int) -> int:
    """In a cloud stretch of ``window`` empty blocks in flight, the room the window must have before
    the next frame of them goes (it fills the room): a quarter of the window, within
    ``max_empty_blocks`` (the verifier's ``Opened.max_empty_blocks``; 1: a frame per block, as to an
    older verifier). Measured (Gemma 3 270M, acespec-50k, AMD EPYC): with a frame per token, the
    verifier's event loop woke on the target's core once a token and its forwards ran 5-10% slower
    than Generate's; a frame per quarter window wakes it a quarter as often and keeps three quarters of
    the window in flight."""
    return max(1, min(window // 4, max_empty_blocks))


def cloud_window_for(round_trip_s: float | None, token_s: float | None) -> int:
    """Empty blocks to keep in flight while the cloud decodes alone, on a link of ``round_trip_s`` with a
    cloud of ``token_s`` a token (None or 0: not known; then ``CLOUD_WINDOW``): enough for the cloud to
    decode on through a round trip and a lost packet's retransmission (a round trip and
    ``RETRANSMIT_FLOOR_S`` more: TCP holds the verdicts behind a lost one until it is resent, and with
    them the edge's next frames of empty blocks), however far the window dips before a frame goes
    (``stretch_top_up``); ``CLOUD_WINDOW`` at least. Measured over satellite (600 ms, 1% loss; Zen 5 EPYC,
    a 44 ms token): 16 in flight made 0.79x of ``Generate``'s pace, this window (43) 1.007x
    (docs/results/2026-12-07-cloud-window-zen5-epyc)."""
    if round_trip_s is None or token_s is None or round_trip_s <= 0 or token_s <= 0:
        return CLOUD_WINDOW
    tokens = math.ceil((2 * round_trip_s + RETRANSMIT_FLOOR_S) / token_s)
    window = max(CLOUD_WINDOW, tokens)
    while window - stretch_top_up(window, window) < tokens:
        window += 1
    return window


def drafting_window_for(round_trip_s: float | None, block_s: float | None) -> int:
    """Drafted blocks worth keeping in flight on a link of ``round_trip_s`` with a cloud that verifies a
    block in ``block_s`` (None or 0: not known; then ``DEFAULT_WINDOW``): as many as it verifies in a
    round trip, so that its forwards need not wait on the link between a chain's verdicts;
    ``DEFAULT_WINDOW`` (the four measured best on short links) at least. Before the Open the link hint's
    round trip and the cloud's seconds a token stand in (both err high: the hint's trip carries the stream's
    headers, a block costs more than a token); the controller then lowers it on its own measurements
    (``Controller.plan``). The adaptive schedule chooses within it, the verifier's
    ``max_blocks_in_flight`` bounds it. Measured against four, paired per prompt (Zen 5 EPYC): over
    satellite (600 ms, a 47 ms token) the default drafter 1.067x (12 of 16), q2_k 0.980x (it drafts twice
    as much a token, most of it voided), both with 9-16% fewer cloud forwards a token; over acespec-50k
    (four, once lowered) 1.014x and 1.021x (docs/results/2026-12-08-drafting-window-zen5-epyc)."""
    if round_trip_s is None or block_s is None or round_trip_s <= 0 or block_s <= 0:
        return DEFAULT_WINDOW
    return max(DEFAULT_WINDOW, math.ceil(round_trip_s / block_s))
