"""The block-by-block simulation the performance model predicts pipelined decoding with: cases
worked out by hand, and what stale blocks and guesses do."""

from __future__ import annotations

import dataclasses

import pytest

from edge.controller import Controller
from sim.perf.block_sim import BlockCosts, simulate_adaptive, simulate_pipelined


def _costs(verify_s: float = 0.05, per_row_s: float = 0.0, **over) -> BlockCosts:
    """Costs whose forward takes ``verify_s`` over one block of one draft and ``per_row_s`` for each row more."""
    base = dict(alpha=[1.0], draft_s=0.01, up_s=lambda drafts: 0.0, rtt_s=0.1, down_s=0.0,
                forward_s=lambda rows: verify_s + per_row_s * max(rows - 2, 0), stale_decode_s=0.03)
    base.update(over)
    return BlockCosts(**base)


def test_two_blocks_in_flight_by_hand():
    """A drafter never wrong, two drafts a block (20 ms), two in flight, 100 ms RTT, 50 ms forwards."""
    run = simulate_pipelined(_costs(draft_s=0.02), 2, 2, generation_tokens=5, generations=1)
    # Block 0 sent at 0.04, at the cloud at 0.09; block 1 sent at 0.08, there at 0.13, after block 0's
    # forward began: each alone (0.09-0.14, 0.14-0.19); their verdicts read at 0.19 and 0.24.
    assert (run.tokens, run.seconds, run.cloud_s, run.verdicts, run.sent) == (4, pytest.approx(0.24), 0.1, 2, 2)


def test_the_verifier_takes_every_block_there_when_it_starts_a_forward():
    """A block every 10 ms, eight in flight, no network delay, a 100 ms forward and 20 ms per extra block."""
    run = simulate_pipelined(_costs(rtt_s=0.0, verify_s=0.1, per_row_s=0.02), 1, 8, generation_tokens=9,
                             generations=1)
    # Seven blocks (the seventh's bonus is the eighth token: the decode loop drafts none past the limit).
    # Block 0 alone (0.01-0.11); blocks 1 to 6, there by 0.07, in one forward of 7 rows (0.11-0.31).
    assert (run.seconds, run.cloud_s, run.verdicts) == (pytest.approx(0.31), pytest.approx(0.30), 7)


def test_a_correction_voids_the_blocks_in_flight_and_the_next_block_guesses_their_tokens():
    """A drafter never right; a verifier that answers stale blocks empty (``--stale-blocks drop``)."""
    run = simulate_pipelined(_costs(alpha=[0.0], decode_stale=False), 1, 3, generation_tokens=4, generations=1)
    # Blocks 0 and 1 go at 0.01 and 0.02 (block 1 leaves room for its bonus only: it asks for no follower);
    # block 0's correction is read at 0.16 (its forward 0.06-0.11), block 1 is void. The next chain's block
    # holds a guess for it (the limit leaves room for no more), drafted 0.16-0.17; block 1 is answered empty
    # at 0.11 (read at 0.16), so the guess is a draft; that block's correction is read at 0.32, and the
    # last token comes from an empty block (0.32-0.47).
    assert (run.tokens, run.seconds, run.verdicts, run.stale, run.sent_drafts) == (3, pytest.approx(0.47), 4, 1, 3)
    assert (run.guessing, run.guesses_held) == (1, 1)


def test_stale_blocks_make_the_cloud_decode_at_the_window_s_pace():
    """A drafter never right on a 600 ms round trip: the blocks in flight past each correction come back
    with a token decoded for each (40 ms), so tokens flow at about four a round trip, not one."""
    costs = _costs(alpha=[0.0], rtt_s=0.6, stale_decode_s=0.04)
    dropped = simulate_pipelined(dataclasses.replace(costs, decode_stale=False), 1, 4, 101, generations=4)
    for guessed in (0.0, 1.0):
        decoded = simulate_pipelined(dataclasses.replace(costs, token_guessed=guessed), 1, 4, 101, generations=4)
        assert 3 / 0.7 < decoded.tokens_per_s <= 4 / 0.64 and decoded.stale > decoded.verdicts / 2
        assert decoded.tokens_per_s > 3 * dropped.tokens_per_s


def test_guesses_hold_as_often_as_the_tokens_under_them_are_guessed():
    costs = _costs(alpha=[0.5], rtt_s=0.6, stale_decode_s=0.04)
    held, speed = {}, {}
    for guessed in (0.0, 0.5, 1.0):
        run = simulate_pipelined(dataclasses.replace(costs, token_guessed=guessed), 4, 4, 129, generations=16)
        held[guessed], speed[guessed] = run.guesses_held / run.guessing, run.tokens_per_s
    # (Guesses with no token decoded under them hold whatever the rate: the void blocks they guessed for
    # were answered empty, as when a usable block waits behind them.)
    assert held[0.0] < 0.05 and 0.2 < held[0.5] < 0.8 and held[1.0] == 1.0
    assert speed[0.0] < speed[0.5] < speed[1.0]


def test_the_early_block_saves_the_first_block_s_drafting_and_trip():
    costs = _costs(rtt_s=0.3)
    without = simulate_pipelined(costs, 4, 4, 33, generations=1)
    early = simulate_pipelined(dataclasses.replace(costs, early_drafts=4), 4, 4, 33, generations=1)
    # It is there when the first token leaves the cloud: the blocks behind it flow one slot earlier.
    assert 0.05 - 1e-9 <= without.seconds - early.seconds <= 0.04 + 0.3 + 0.05
    # Drafted on a wrong guess of the first token, it commits that one token and nothing is chained on it.
    wrong = simulate_pipelined(dataclasses.replace(costs, alpha=[0.0, 1.0], early_drafts=4), 4, 4, 33, generations=1)
    assert wrong.seconds > early.seconds


def test_a_seed_gives_the_same_run_and_bad_shapes_are_refused():
    costs = _costs(alpha=[0.7, 0.6])
    assert simulate_pipelined(costs, 4, 3, 64, seed=5) == simulate_pipelined(costs, 4, 3, 64, seed=5)
    for draft_len, window, tokens in ((0, 2, 10), (2, 0, 10), (2, 2, 1)):
        with pytest.raises(ValueError):
            simulate_pipelined(costs, draft_len, window, tokens)


def test_a_stale_decode_overruns_the_next_block_s_due_time_where_the_guesses_seldom_hold():
    """A slow cloud (330 ms a token) on a short round trip (60 ms), as measured on lte with the q3_k_s
    drafter on a slow VM: the next chain's block is due before a stale decode could end, so the verifier of
    rejection mode decodes nothing for stale blocks after a correction; in greedy and coupled modes, with first drafts
    that hold a third of the time, a stale decode pays (the edge hears of a wrong guess sooner), and the run is
    faster at every window, at more cloud work per token."""
    costs = _costs(alpha=[0.35], rtt_s=0.06, draft_s=0.037, verify_s=0.35 - 3 * 0.0075, per_row_s=0.0075, stale_decode_s=0.33,
                   early_drafts=4)
    for window, gain in ((2, 1.2), (4, 1.03)):
        held = simulate_pipelined(costs, 4, window, 65, generations=64)
        overrun = simulate_pipelined(dataclasses.replace(costs, stale_decode_overruns=True), 4, window, 65, generations=64)
        assert overrun.tokens_per_s > gain * held.tokens_per_s
        assert overrun.cloud_s / overrun.tokens > held.cloud_s / held.tokens


def test_a_session_s_controller_hands_a_useless_drafter_to_the_cloud_and_keeps_a_good_one_drafting():
    """The closed loop: a fresh controller each generation, fed what the simulated verdicts measure. On a
    600 ms round trip with a 50 ms forward (13 of the cloud's tokens a round trip: every session starts
    with the cloud alone, ``Controller.start``), a drafter never right leaves it decoding alone (empty
    blocks, one forward of one row each, a round trip and a retransmission's worth in flight:
    ``cloud_window_for``) at its forward's pace; a drafter never wrong is handed the session once its
    shadow proposals have shown it and that window has drained, and drafts the rest."""
    costs = _costs(rtt_s=0.6, forward_s=lambda rows: 0.05 + 0.001 * (rows - 1), stale_decode_s=0.05, early_drafts=4)
    useless = simulate_adaptive(dataclasses.replace(costs, alpha=[0.0]), lambda: Controller(8, 4, 16), 257,
                                generations=4)
    assert useless.empty > 0.8 * useless.tokens
    # The tokens decoded for the last chain's stale blocks do not make the stretch's empty blocks stale
    # (each asks for the next token, wherever it is): they are answered, and measure the cloud alone.
    assert useless.stale < 0.05 * useless.verdicts
    assert 0.8 / 0.05 < useless.tokens_per_s < 1 / 0.05
    good = simulate_adaptive(costs, lambda: Controller(8, 4, 16), 257, generations=4)
    assert 0 < good.empty < 0.25 * good.tokens and good.sent_drafts >= good.tokens - good.sent - good.empty
    assert good.tokens_per_s > 1.5 * useless.tokens_per_s  # (its first ~55 tokens at the cloud's pace)
    assert simulate_adaptive(costs, lambda: Controller(8, 4, 16), 64, seed=3) == simulate_adaptive(
        costs, lambda: Controller(8, 4, 16), 64, seed=3)


def test_the_simulated_verdicts_feed_the_controller_s_row_cost_curve_as_the_edge_s_do():
    """Each simulated forward is a point of the controller's row-cost curve at its rows (a block's drafts
    and one more, every block of the chain there; one for a token alone), priced by ``forward_s`` (a stale
    decode's by ``stale_decode_s``, here the same as one row's)."""
    forward_s = lambda rows: 0.05 + 0.01 * (rows - 1)  # noqa: E731
    controllers = []

    def made() -> Controller:
        controllers.append(Controller(8, 4, 16))
        return controllers[-1]

    simulate_adaptive(_costs(rtt_s=0.1, forward_s=forward_s, stale_decode_s=forward_s(1), alpha=[0.8]), made, 65,
                      generations=1)
    points = controllers[0].forward_cost.measured
    assert len(points) >= 2 and all(seconds == pytest.approx(forward_s(rows)) for rows, seconds in points.items())
