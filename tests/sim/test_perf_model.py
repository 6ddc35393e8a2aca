"""The performance model: hand-computed cases, monotonicity, fitting, hardware profiles, the CLI."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from edge.drafter import DrafterStats
from edge.report import SPLIT, EdgeReport
from shared.acceptance import ChainCosts, chain_expectation, pipelined_chain, stale_expectation
from shared.stats import DecodeStats
from sim.link.config import DirectionConfig, LinkConfig
from sim.link.scenario import list_scenarios, load_scenario
from sim.perf.fit import timings_from_reports
from sim.perf.hardware_profile import list_hardware, load_hardware
from sim.perf.model import (
    NetworkModel,
    Timings,
    best_draft_len,
    expected_acceptance_length,
    fit_linear,
    predict_cloud_only,
    predict_pipelined,
    predict_split,
    protocol_bytes,
)

REPO = Path(__file__).resolve().parents[2]


def _timings(**over) -> Timings:
    base = dict(
        draft_s_per_token=0.010,
        verify_fixed_s=0.050,
        verify_per_token_s=0.001,
        alpha_per_position=[0.5],
        up_bytes_fixed=20.0,
        up_bytes_per_draft=2.0,
        down_bytes_per_round=30.0,
        down_bytes_per_token_cloud_only=20.0,
    )
    base.update(over)
    return Timings(**base)


# ---------------------------------------------------------------- hand-computed cases


def test_round_time_by_hand():
    t = _timings()
    link = NetworkModel(up_bps=8000, down_bps=16000, rtt_s=0.1)
    p = predict_split(t, link, 4)
    # draft 4 * 10 ms; up (20 + 4*2 + 52) B * 8 / 8000; rtt; verify 50 + 5*1 ms; down (30 + 52) * 8 / 16000
    expected = {"draft": 0.040, "uplink": 0.080, "rtt": 0.100, "verify": 0.055, "downlink": 0.041}
    assert p.breakdown == pytest.approx(expected)
    assert p.round_s == pytest.approx(0.316)
    al = 1 + 0.5 + 0.25 + 0.125 + 0.0625
    assert p.acceptance_length == pytest.approx(al)
    assert p.tokens_per_s == pytest.approx(al / 0.316)
    assert p.cloud_s_per_token == pytest.approx(0.055 / al)
    assert p.up_bytes_per_token == pytest.approx(28 / al)
    assert p.down_bytes_per_token == pytest.approx(30 / al)
    assert p.limit == "rtt"


def test_the_measured_rate_of_right_guesses_reaches_the_prediction():
    link = NetworkModel(up_bps=50_000, down_bps=50_000, rtt_s=0.1)
    speeds = [predict_pipelined(_timings(alpha_per_position=[0.8], stale_decode_guess_hit=h), link, 4, 4).tokens_per_s
              for h in (1.0, 0.5, 0.25)]
    assert speeds[0] > speeds[1] > speeds[2]


def test_a_chain_by_hand():
    """alpha 0.5, D 2: p = 0.25, 4/3 blocks a chain; E[accepted | a block fails] * P(fail) = 0.25."""
    blocks, tokens, p_full = chain_expectation([0.5], 2)
    assert (blocks, p_full) == (pytest.approx(4 / 3), 0.25)
    assert tokens == pytest.approx((4 / 3 - 1) * 2 + 0.25 / 0.75 + 1)
    with pytest.raises(ValueError):
        chain_expectation([0.5], 0)


def test_stale_blocks_bring_as_many_tokens_as_fit_in_the_gap():
    # Three stale blocks, room for two forwards: two tokens; both guesses right with 0.9 * 0.9.
    assert stale_expectation([0.9], 3, gap_s=0.10, stale_decode_s=0.04) == pytest.approx((2.19, 2.19, 0.19 * 0.10))
    assert stale_expectation([0.9], 0, gap_s=1.0, stale_decode_s=0.01) == (0.0, 0.0, 0.0)
    assert stale_expectation([1.0, 0.0], 5, gap_s=1.0, stale_decode_s=0.01) == pytest.approx((6, 6, 1.0))
    # Each forward also accepts half a rebased draft on average: 3 tokens to guess, 0.9 ** 3 right.
    miss = 1 - 0.9 ** 3
    assert stale_expectation([0.9], 3, gap_s=0.10, stale_decode_s=0.04, rebased_per_stale_decode=0.5) == pytest.approx(
        (2 + miss, (2 + miss) * 1.5, miss * 0.10))
    # No forward fits in the gap: nothing decoded, nothing guessed.
    assert stale_expectation([0.9], 3, gap_s=0.01, stale_decode_s=0.04) == (0.0, 0.0, 0.0)


def test_a_verifier_that_decodes_ahead_spends_a_corrections_gap_as_the_cloud_alone_would():
    # One stale block, room for three forwards: one stale decode, then two ahead (the gate: the guesses of
    # tokens 1 and 2 miss more often than they hold, (1 - 2 * 0.25) + (1 - 2 * 0.125) >= 0). The block's
    # guesses of all three hold with 0.125: 7 gaps more on average, each the missed token and two more.
    assert stale_expectation([0.5], 1, gap_s=0.35, stale_decode_s=0.1, ahead_limit=8) == pytest.approx(
        (1 + 2 + 7 * 3, 3 + 7 * 3, 7 * 0.35))
    # At most ``ahead_limit`` held; a drafter whose guesses hold gets none (the gate): as without it.
    assert stale_expectation([0.5], 1, gap_s=0.35, stale_decode_s=0.1, ahead_limit=1)[1] == pytest.approx(2 + 3 * 3)
    assert stale_expectation([0.99], 3, 0.85, 0.1, ahead_limit=11) == stale_expectation([0.99], 3, 0.85, 0.1)
    # On a satellite-like link (measured costs, AMD EPYC) a weak drafter's chains keep near the cloud's own
    # pace (0.1 s a token) where the verifier decodes ahead, never above it, and fall far below it where it
    # leaves the gap idle.
    costs = ChainCosts(draft_s_per_token=0.022, network_s=0.61, verify_s=0.173, stale_decode_s=0.1)
    for alpha in (0.0, 0.3, 0.6):
        idle = pipelined_chain([alpha], 8, 4, costs)
        ahead = pipelined_chain([alpha], 8, 4, dataclasses.replace(costs, ahead_limit=11))
        assert idle.tokens / idle.seconds < 5.0, alpha
        assert 8.5 < ahead.tokens / ahead.seconds <= 10.0, alpha


def test_pipelining_helps_when_the_round_trip_dominates_and_window_1_is_lockstep():
    t = _timings(alpha_per_position=[0.9])
    slow = NetworkModel(up_bps=50_000, down_bps=50_000, rtt_s=0.6)
    assert predict_pipelined(t, slow, 6, 1) == predict_split(t, slow, 6)
    speeds = [predict_pipelined(t, slow, 6, w).tokens_per_s for w in (1, 2, 3, 4)]
    assert speeds[0] < speeds[1] < speeds[2] < speeds[3]
    # A drafter that is never right, and a verifier that answers stale blocks empty: each chain is one
    # block, its correction the one token; the next block guesses the void blocks' tokens besides its six
    # drafts (nothing was decoded under them: they are drafts), and its trip starts when the correction is read.
    never = _timings(alpha_per_position=[0.0])
    trip = 9 * 0.010 + slow.up_s(never.up_bytes(9)) + 0.6 + never.verify_s(7) + slow.down_s(30.0)
    assert predict_pipelined(never, slow, 6, 4, decode_stale=False).tokens_per_s == pytest.approx(1 / trip, rel=0.02)
    # With stale blocks answered with a token decoded for each, the cloud decodes alone at the window's
    # pace: four blocks a round trip, each a token, not one token a round trip.
    alone = predict_pipelined(never, slow, 6, 4)
    assert 3 / (trip + 0.051) < alone.tokens_per_s <= 4 / (0.6 + 0.051)


def test_the_adaptive_schedule_is_predicted_as_a_session_runs_its_controller():
    """A fresh controller each generation, learning from the simulated verdicts: never above the best
    configuration (beyond the simulations' noise). Where the cloud alone is fastest (cheap forwards, a
    600 ms round trip) a generation starts with it (the head start, ``Controller.start``), so a short one
    pays for no chain drafted on priors, and a long one ends near its pace whatever the drafter; where
    drafting pays, near the best."""
    from sim.perf.model import best_adaptive, predict_adaptive

    slow = NetworkModel(up_bps=50_000, down_bps=50_000, rtt_s=0.6)
    for alpha in (0.0, 0.9):
        t = _timings(alpha_per_position=[alpha])
        short, long = predict_adaptive(t, slow, 8, 4, 64), predict_adaptive(t, slow, 8, 4, 1024)
        best = best_adaptive(t, slow, 8, 4, 1024)
        assert best.draft_len == 0
        assert short.tokens_per_s > 0.85 * long.tokens_per_s and 0.9 * best.tokens_per_s < long.tokens_per_s
        assert long.tokens_per_s <= 1.02 * best.tokens_per_s
    fast = NetworkModel(up_bps=50_000, down_bps=50_000, rtt_s=0.1)
    t = _timings(alpha_per_position=[0.9], verify_fixed_s=0.3, draft_s_per_token=0.02)
    adaptive, best = predict_adaptive(t, fast, 8, 4, 1024), best_adaptive(t, fast, 8, 4, 1024)
    assert best.draft_len > 0 and 0.95 * best.tokens_per_s < adaptive.tokens_per_s <= 1.02 * best.tokens_per_s
    assert adaptive.tokens_per_s > 3 * predict_cloud_only(t, fast).tokens_per_s


def test_a_short_generation_pays_its_last_round_trip():
    """A drafter that is never wrong makes one chain of the whole generation, over when the last
    verdict is read, which a long generation amortises away."""
    t = _timings(alpha_per_position=[1.0])
    link = NetworkModel(up_bps=0, down_bps=0, rtt_s=0.1)
    short = predict_pipelined(t, link, 4, 4, generation_tokens=16)
    assert short.tokens_per_s < 0.75 * predict_pipelined(t, link, 4, 4).tokens_per_s
    assert predict_pipelined(t, link, 4, 4, generation_tokens=4096).tokens_per_s == pytest.approx(
        predict_pipelined(t, link, 4, 4).tokens_per_s, rel=0.05)


def test_loss_stall_and_segments_by_hand():
    link = NetworkModel(up_bps=80_000, down_bps=0, rtt_s=0.0, loss=0.1, rto_s=0.2, down_loss=0.0)
    # 3000 B = 3 segments of <= 1448: (3000 + 3*52) * 8 / 80000 + 0.1 * 3 * 0.2
    assert link.up_s(3000) == pytest.approx(3156 * 8 / 80_000 + 0.06)
    assert link.down_s(3000) == 0.0  # unlimited and lossless
    assert link.segments(0) == 0 and link.segments(1448) == 1 and link.segments(1449) == 2


def test_cloud_only_by_hand():
    t = _timings(prefill_s=0.2, open_up_bytes=100.0)
    fast = NetworkModel(up_bps=0, down_bps=0, rtt_s=0.1)
    p = predict_cloud_only(t, fast)
    assert p.tokens_per_s == pytest.approx(1 / 0.051)
    assert p.ttft_s == pytest.approx(0.1 + 0.2)  # the prefill's last row gives the first token
    assert p.cloud_s_per_token == pytest.approx(0.051) and p.limit == "verify"
    # 20 + 52 bytes at 8 kbit/s = 72 ms per chunk > 51 ms per forward: the downlink limits.
    slow = NetworkModel(up_bps=8000, down_bps=8000, rtt_s=0.1)
    p = predict_cloud_only(t, slow)
    assert p.tokens_per_s == pytest.approx(1 / 0.072)
    assert p.limit == "downlink"
    assert p.cloud_s_per_token == pytest.approx(0.051)  # the cloud's work does not change


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.8, 0.95])
@pytest.mark.parametrize("d", [0, 1, 2, 5, 16])
def test_acceptance_length_constant_alpha(alpha, d):
    closed = 1 + alpha * (1 - alpha**d) / (1 - alpha)
    assert expected_acceptance_length([alpha], d) == pytest.approx(closed)


def test_acceptance_length_extends_last_alpha():
    assert expected_acceptance_length([1.0], 7) == 8.0
    # [0.9, 0.5] then 0.5, 0.5: 1 + .9 + .45 + .225 + .1125
    assert expected_acceptance_length([0.9, 0.5], 4) == pytest.approx(2.6875)
    assert expected_acceptance_length([0.9, 0.5, 0.1], 2) == pytest.approx(1 + 0.9 + 0.45)
    with pytest.raises(ValueError):
        expected_acceptance_length([], 3)
    with pytest.raises(ValueError):
        expected_acceptance_length([0.5], -1)


# ---------------------------------------------------------------- monotonicity


def test_more_bandwidth_never_predicts_fewer_tokens():
    t = _timings(alpha_per_position=[0.8])
    rates = [2_000, 10_000, 50_000, 1_000_000, 0]  # 0 = unlimited, the most
    for d in range(0, 17):
        speeds = [predict_split(t, NetworkModel(r, r, 0.05), d).tokens_per_s for r in rates]
        assert speeds == sorted(speeds), (d, speeds)
    speeds = [predict_cloud_only(t, NetworkModel(r, r, 0.05)).tokens_per_s for r in rates]
    assert speeds == sorted(speeds)
    for up_only in ([(r, 50_000) for r in rates], [(50_000, r) for r in rates]):
        speeds = [predict_split(t, NetworkModel(u, dn, 0.05), 6).tokens_per_s for u, dn in up_only]
        assert speeds == sorted(speeds)


def test_higher_alpha_never_predicts_fewer_tokens():
    link = NetworkModel(50_000, 50_000, 0.1)
    alphas = [0.0, 0.2, 0.5, 0.8, 0.9, 1.0]
    for d in range(0, 17):
        speeds = [predict_split(_timings(alpha_per_position=[a]), link, d).tokens_per_s for a in alphas]
        assert speeds == sorted(speeds), (d, speeds)


def test_best_draft_len_is_the_argmax():
    t = _timings(alpha_per_position=[0.8])
    link = NetworkModel(50_000, 50_000, 0.1)
    best = best_draft_len(t, link, 16)
    speeds = {d: predict_split(t, link, d).tokens_per_s for d in range(1, 17)}
    assert speeds[best] == max(speeds.values())
    assert best_draft_len(_timings(alpha_per_position=[1.0], draft_s_per_token=0.0), link, 5) == 5
    assert best_draft_len(_timings(alpha_per_position=[0.0]), link, 16) == 1


# ---------------------------------------------------------------- fitting and link config


def test_fit_linear_recovers_a_line():
    samples = [(n, 0.05 + 0.003 * n) for n in (1, 2, 5, 9, 17)]
    intercept, slope = fit_linear(samples)
    assert intercept == pytest.approx(0.05) and slope == pytest.approx(0.003)
    noisy = [(x, 3.0 + 2.0 * x + (0.01 if i % 2 else -0.01)) for i, x in enumerate(range(20))]
    intercept, slope = fit_linear(noisy)
    assert intercept == pytest.approx(3.0, abs=0.02) and slope == pytest.approx(2.0, abs=0.002)


def test_fit_linear_single_x_is_intercept_only():
    assert fit_linear([(9, 0.2), (9, 0.4)]) == pytest.approx((0.3, 0.0))
    assert fit_linear([(4, 1.0)]) == (1.0, 0.0)
    with pytest.raises(ValueError):
        fit_linear([])


def test_link_model_from_link_config():
    cfg = LinkConfig(up=DirectionConfig(rate_bps=5_000_000, delay_s=0.03, loss=0.01, rto_s=0.3),
                     down=DirectionConfig(rate_bps=10_000_000, delay_s=0.02, loss=0.0))
    link = NetworkModel.from_link_config(cfg)
    assert (link.up_bps, link.down_bps, link.rtt_s) == (5_000_000, 10_000_000, pytest.approx(0.05))
    assert link.up_s(100) == pytest.approx(152 * 8 / 5e6 + 0.01 * 0.3)
    assert link.down_s(100) == pytest.approx(152 * 8 / 1e7)
    acespec = NetworkModel.from_link_config(load_scenario("acespec-50k").link)
    assert (acespec.up_bps, acespec.rtt_s) == (50_000, pytest.approx(0.1))


def test_protocol_bytes_match_the_real_frames():
    """The defaults agree with real protobuf frames within a byte (epoch 3, position 700)."""
    import numpy as np

    from protos import splitspec_pb2 as pb
    from shared import codec
    from shared.wire import http2_framed_size

    for vocab in (262_144, 128_256):
        b = protocol_bytes(vocab)
        rng = np.random.default_rng(0)
        for d in (1, 2, 4, 8, 16):
            payload = codec.encode_tokens(rng.integers(0, vocab, d), vocab)
            frame = pb.EdgeFrame(draft=pb.Draft(epoch=3, start_position=700, payload=payload.data))
            real = http2_framed_size(frame.ByteSize())
            assert abs(b["up_fixed"] + b["up_per_draft"] * d - real) <= 1, (vocab, d, real)
        verdict = pb.CloudFrame(verdict=pb.Verdict(epoch=3, start_position=700, accepted=4,
                                                   token=vocab - 1, server_us=60_000))
        assert abs(b["down_per_round"] - http2_framed_size(verdict.ByteSize())) <= 1
        chunk = pb.GenerateChunk(tokens=codec.encode_tokens([vocab - 1], vocab).data)
        assert b["down_per_token_cloud_only"] == http2_framed_size(chunk.ByteSize())


# ---------------------------------------------------------------- hardware profiles


def test_shipped_hardware_profiles_load():
    assert {"llama70b-8xh100-mac", "gemma270m-cpu"} <= set(list_hardware())
    for name in list_hardware():
        profile = load_hardware(name)
        t = profile.to_timings()
        assert profile.name == name and profile.description
        assert t.verify_s(1) > 0 and t.draft_s_per_token > 0 and t.alpha_per_position
        for scenario in list_scenarios():
            link = NetworkModel.from_link_config(load_scenario(scenario).link)
            assert math.isfinite(predict_split(t, link, best_draft_len(t, link)).tokens_per_s)


def test_gemma_cpu_profile_matches_the_measured_forwards():
    t = load_hardware("gemma270m-cpu").to_timings()
    assert t.verify_s(1) == pytest.approx(0.1) and t.verify_s(9) == pytest.approx(0.2)
    assert t.draft_s_per_token == pytest.approx(0.028)


def test_llama70b_cloud_only_is_15_to_20_tokens_per_s():
    t = load_hardware("llama70b-8xh100-mac").to_timings()
    for scenario in list_scenarios():
        link = NetworkModel.from_link_config(load_scenario(scenario).link)
        assert 15.0 <= predict_cloud_only(t, link).tokens_per_s <= 20.0, scenario
    # Memory-bound decode: a 9-token verify costs nearly what a 1-token step does.
    assert t.verify_s(9) / t.verify_s(1) < 1.1


def test_rebased_drafts_make_a_stale_blocks_forward_commit_more_for_less():
    """What a stale block's forward commits past its token (rebased drafts) makes chains faster and each
    token cheaper for the cloud; the 70B profile's assumption is read from its file."""
    profile = load_hardware("llama70b-8xh100-mac")
    assert profile.rebased_per_stale_decode > 0 and profile.rebased_verified_per_stale_decode >= profile.rebased_per_stale_decode
    t = profile.to_timings()
    link = NetworkModel.from_link_config(load_scenario("acespec-50k").link)
    alone = predict_pipelined(dataclasses.replace(t, rebased_per_stale_decode=0.0, rebased_verified_per_stale_decode=0.0), link, 4, 4)
    rebased = predict_pipelined(t, link, 4, 4)
    assert rebased.tokens_per_s > alone.tokens_per_s and rebased.cloud_s_per_token < alone.cloud_s_per_token
    assert predict_pipelined(t, link, 4, 4, decode_stale=False) == predict_pipelined(
        dataclasses.replace(t, rebased_per_stale_decode=0.0), link, 4, 4, decode_stale=False)  # nothing to rebase


def test_hardware_file_errors(tmp_path):
    with pytest.raises(ValueError, match="shipped"):
        load_hardware("no-such-profile")
    with pytest.raises(ValueError, match="not found"):
        load_hardware(tmp_path / "missing.toml")
    good = (REPO / "sim" / "perf" / "hardware" / "gemma270m-cpu.toml").read_text()
    typo = tmp_path / "typo.toml"
    typo.write_text(good.replace("verify_per_token_ms", "verify_per_tokn_ms"))
    with pytest.raises(ValueError, match="verify_per_tokn_ms"):
        load_hardware(typo)
    listed = tmp_path / "listed.toml"
    listed.write_text(good.replace("alpha = 0.85", "alpha = [0.9, 0.7]"))
    assert load_hardware(str(listed)).alpha == [0.9, 0.7]
    bad = tmp_path / "bad.toml"
    bad.write_text(good.replace("alpha = 0.85", "alpha = 1.5"))
    with pytest.raises(ValueError, match="alpha"):
        load_hardware(bad)
    negative = tmp_path / "negative.toml"
    negative.write_text(good.replace("alpha = 0.85", "alpha = 0.85\nrebased_per_stale_decode = -1"))
    with pytest.raises(ValueError, match="rebased_per_stale_decode"):
        load_hardware(negative)


# ---------------------------------------------------------------- CLI


@pytest.mark.slow
def test_sim_model_cli_json_is_labelled_modelled():
    result = subprocess.run(
        [sys.executable, "-m", "sim.cli", "sim", "model", "--hardware", "llama70b-8xh100-mac", "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["kind"] == "modelled" and "MODELLED, not measured" in report["label"]
    assert report["scenario"]["name"] == "acespec-50k"
    rows = report["rows"]
    assert [r["draft_len"] for r in rows] == list(range(17))
    assert rows[0]["config"] == "cloud-only" and 15 <= rows[0]["tokens_per_s"] <= 20
    assert all(r["config"] == "split" for r in rows[1:])
    best = max(rows[1:], key=lambda r: r["tokens_per_s"])
    assert report["best_draft_len"] == best["draft_len"]
    # The pipelined headline: the fastest within 1%, the least cloud compute among them.
    piped, chosen = report["pipelined_rows"], report["best_pipelined"]
    fastest = max(r["tokens_per_s"] for r in piped)
    near = [r for r in piped if r["tokens_per_s"] * 1.01 >= fastest]
    assert chosen in near and chosen["cloud_compute_vs_cloud_only"] == min(r["cloud_compute_vs_cloud_only"] for r in near)
    # The adaptive row: a session's controller, learning as it goes, gets near the best it could choose.
    adaptive = report["adaptive"]
    assert adaptive["config"] == "adaptive" and 1 <= adaptive["draft_len"] <= 16
    assert 0.85 * fastest < adaptive["tokens_per_s"] <= 1.02 * fastest
    assert {"draft", "uplink", "rtt", "verify", "downlink"} == set(rows[3]["breakdown"])


@pytest.mark.slow
def test_sim_model_cli_table_and_errors(capsys):
    from sim.cli import main

    assert main(["sim", "model", "--hardware", "gemma270m-cpu", "--scenario", "wan", "--max-draft-len", "4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("MODELLED, not measured: gemma270m-cpu on wan")
    assert "0 (cloud-only)" in out and "best D = " in out
    lines = out.splitlines()
    top = lines.index("") + 1  # the table follows the header block
    assert lines[top].startswith("D ") and set(lines[top + 1]) == {"-", " "}
    import re

    from sim.perf.report import model_report

    report = model_report("gemma270m-cpu", "wan", 4)
    table = [re.split(r"\s{2,}", line.strip()) for line in lines[top + 2: top + 7]]
    assert [cells[0] for cells in table] == ["0 (cloud-only)", "1", "2", "3", "4"]
    assert [cells[1] for cells in table] == [f"{r['tokens_per_s']:.2f}" for r in report["rows"]]
    assert [cells[-1] for cells in table] == [f"{r['limit']} ({r['limit_share']:.0%})" for r in report["rows"]]
    assert lines[top + 7] == ""
    assert main(["sim", "model", "--hardware", "no-such-profile"]) == 2
    assert "unknown hardware profile" in capsys.readouterr().err


def test_the_drafter_speed_fitted_counts_every_token_it_drafted():
    """Drafts of blocks that came back stale (and guesses, branches) cost the drafter time too: its
    speed is its own time over its own token count, not over the drafts the cloud verified."""
    decode = DecodeStats()
    decode.record_round(drafted=4, accepted=2, committed=3)  # the one block verified; another came back stale
    drafter = DrafterStats(drafted=8, draft_s=0.16, eval_s=0.15, prompt_eval_s=0.04)
    report = EdgeReport(kind=SPLIT, tokens=[1, 2, 3], text="", stop_reason="length", prompt_tokens=5, wall_s=1.0,
                        ttft_s=0.3, open_s=0.25, ttft_cloud_s=0.2, bytes_up=100, bytes_down=60, rtt_ms=100.0, decode=decode,
                        drafter=drafter)
    timings = timings_from_reports([report], [], "coupled")
    assert timings.draft_s / timings.drafted == pytest.approx((0.16 - 0.04) / 8)
    assert timings.accepted_at == [1, 1, 0, 0] and timings.drafted_at == [1, 1, 1, 1]  # acceptance: verified drafts


def test_the_fit_takes_what_stale_blocks_forwards_committed_per_run():
    decode = DecodeStats()
    decode.record_round(drafted=4, accepted=2, committed=3)
    decode.record_stale(3, rebased=2, verified=3)  # two rebased drafts, then the token
    decode.record_stale(1, rebased=0, verified=2)
    decode.record_stale(0)  # answered empty: no forward
    decode.record_stale(2, ahead=2)  # both tokens decoded ahead, before the block came: no forward of its own
    decode.record_stale_decode_guess(hit=True)  # the next chains' first blocks had guessed the first two's tokens: one right
    decode.record_stale_decode_guess(hit=False)
    report = EdgeReport(kind=SPLIT, tokens=[1] * 9, text="", stop_reason="length", prompt_tokens=5, wall_s=1.0,
                        ttft_s=0.3, open_s=0.25, ttft_cloud_s=0.2, bytes_up=100, bytes_down=60, rtt_ms=100.0, decode=decode,
                        drafter=DrafterStats(drafted=8, draft_s=0.16))
    measured = timings_from_reports([report], [], "coupled")
    assert (measured.stale_decoded, measured.rebased, measured.rebased_verified) == (2, 2, 5)
    assert (measured.stale_decode_guesses, measured.stale_decode_guesses_hit) == (2, 1)
    assert decode.generated == 9 and decode.stale == 4


def test_service_samples_are_the_cloud_steps_between_two_scrapes():
    """One sample per verify step between the scrapes, at its rows count's mean time: a line through
    them is the line through the steps."""
    from sim.perf.fit import service_samples

    before = {"splitspec_verify_service_seconds_count": {"1": 3.0, "5": 1.0},
              "splitspec_verify_service_seconds_sum": {"1": 0.3, "5": 0.2}}
    after = {"splitspec_verify_service_seconds_count": {"1": 5.0, "5": 1.0, "9": 2.0},
             "splitspec_verify_service_seconds_sum": {"1": 0.52, "5": 0.2, "9": 0.5}}
    samples = service_samples(before, after)
    assert [rows for rows, _ in sorted(samples)] == [1, 1, 9, 9]
    assert [seconds for _, seconds in sorted(samples)] == pytest.approx([0.11, 0.11, 0.25, 0.25])
    assert service_samples(after, after) == [] and service_samples({}, {}) == []


def test_each_mode_gets_its_own_verify_line_where_its_steps_span_two_sizes():
    """Rejection steps cost more per row here; greedy ran steps of one size only: it gets the pooled line."""
    from sim.perf.fit import RunTimings, fit_timings

    def run(mode, samples):
        return RunTimings(mode=mode, drafted=8, draft_s=0.08, accepted_at=[1], drafted_at=[1], verify_samples=samples,
                          up_samples=[(4, 40.0), (8, 50.0)], down_samples=[30.0], open_s=[0.3], prompt_s=[0.01])

    coupled = run("coupled", [(1, 0.09), (5, 0.10), (9, 0.12)])
    rejection = run("rejection", [(5, 0.11), (9, 0.15)])
    greedy = run("greedy", [(5, 0.10), (5, 0.10)])
    fitted = fit_timings([coupled, rejection, greedy], [], [(1, 0.07)])
    assert set(fitted.verify_lines) == {"coupled", "rejection"}
    assert fitted.verify_line("coupled") == pytest.approx((0.075, 0.005))  # through (5, 0.10) and (9, 0.12)
    assert fitted.verify_line("rejection") == pytest.approx((0.06, 0.01))
    assert fitted.verify_line("greedy") == (fitted.base.verify_fixed_s, fitted.base.verify_per_token_s)
    assert fitted.for_timings(rejection).verify_s(9) == pytest.approx(0.15)
    assert fitted.base.verify_one_s == pytest.approx(0.08)  # the one-row steps: cloud-only's and the runs'


def test_each_prompt_is_predicted_with_its_own_acceptance_and_the_run_adds_their_times():
    """Two prompts the drafter guesses very differently: each is predicted with its own acceptance (the
    drafter's speed and the bytes are the run's), and the run's rate is its tokens over the sum of the
    prompts' times, as measured, not the rate of a pooled acceptance."""
    from sim.experiment.prediction import _error, _predicted_rate
    from sim.perf.fit import RunTimings, fit_timings

    def part(accepted_at, drafted_at, tokens):
        return RunTimings(mode="coupled", drafted=sum(drafted_at), draft_s=0.01 * sum(drafted_at), accepted_at=accepted_at,
                          drafted_at=drafted_at, verify_samples=[(5, 0.10), (9, 0.12)], up_samples=[(4, 40.0), (8, 50.0)],
                          down_samples=[30.0], open_s=[0.3], prompt_s=[0.01], tokens=tokens)

    easy, hard = part([9, 9, 9, 9], [10, 10, 10, 10], 64), part([2, 0, 0, 0], [10, 2, 0, 0], 64)
    pooled = part([11, 9, 9, 9], [20, 12, 10, 10], 128)
    fitted = fit_timings([pooled], [], [(1, 0.07)])
    # Draft i was reached (hits at i-1) x (blocks that held draft i) / (those that held draft i-1) times;
    # each position's rate is shrunk toward the prompt's pooled one by 4 pseudo-trials, as the controller's.
    shrunk = lambda hits, trials, pooled: [(h + 4 * pooled) / (t + 4) for h, t in zip(hits, trials)]  # noqa: E731
    assert fitted.for_prompt(pooled, easy).alpha_per_position == pytest.approx(
        shrunk([9, 9, 9, 9], [10, 9, 9, 9], 36 / 37))  # [0.92, 0.99, 0.99, 0.99]
    assert fitted.for_prompt(pooled, hard).alpha_per_position == pytest.approx(
        shrunk([2, 0], [10, 0.4], 2 / 10.4))  # [0.20, 0.17]: a draft reached 0.4 times says little
    assert fitted.for_prompt(pooled, hard).draft_s_per_token == fitted.for_timings(pooled).draft_s_per_token
    link = NetworkModel(up_bps=50_000, down_bps=50_000, rtt_s=0.6)
    parts = [(predict_pipelined(fitted.for_prompt(pooled, p), link, 4, 4, generation_tokens=64), 64, 0.01)
             for p in (easy, hard)]
    predicted, _ = _predicted_rate(parts)
    walls = [p.ttft_s + 0.01 + 63 / p.tokens_per_s for p, _, _ in parts]
    assert predicted == pytest.approx(128 / sum(walls))
    assert _error(predicted, 10.0) == pytest.approx(predicted / 10.0 - 1)
    assert parts[0][0].tokens_per_s > 2 * parts[1][0].tokens_per_s  # (the hard prompt takes most of the time)
