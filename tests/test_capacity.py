"""Capacity: the bench (real verifier process, replayed real drafts), the soak, the modelled table, the GPU check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim.bench.capacity import ReplayDrafter, capacity_at_slo
from sim.link.scenario import load_scenario
from sim.perf.capacity import capacity_at_slo as modelled_capacity_at_slo
from sim.perf.capacity import capacity_rows
from sim.perf.hardware_profile import load_hardware
from sim.perf.model import NetworkModel

ROOT = Path(__file__).resolve().parents[1]
SPLITSPEC = [sys.executable, "-m", "sim.cli"]


@pytest.mark.slow
def test_bench_capacity_runs_both_modes_batched_and_not_and_every_output_is_target_only(tmp_path):
    out = subprocess.run([*SPLITSPEC, "bench", "capacity", "--tiny", "--sessions", "1", "3", "--no-batching",
                          "--max-new-tokens", "16", "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert set(report["capacity_at_slo"]) == {"cloud-only", "coupled"}
    runs = report["runs"]
    assert [(r["mode"], r["sessions"], r["batching"]) for r in runs] == [
        (mode, n, batching) for batching in (True, False) for n in (1, 3) for mode in ("cloud-only", "coupled")]
    for run in runs:
        assert run["identical"] and not run["errors"] and run["replay_misses"] == 0, run
        assert run["aggregate_tokens_per_s"] > 0 and run["per_session_tokens_per_s_p10"] <= run["per_session_tokens_per_s_p50"]
        assert 0 < run["verifier_busy"] <= 1.0 and run["cloud_cpu_s_per_token"] > 0
        if not run["batching"]:
            assert run["mean_batch_sessions"] == 1.0
    coupled = [r for r in runs if r["mode"] == "coupled"]
    assert all(r["cloud_forwards_per_token"] < 1 for r in coupled)  # drafts were accepted
    assert 0 < report["acceptance"]["coupled"] < 1 and report["verifier_cores"] is not None


def test_capacity_at_slo_is_the_largest_batched_count_meeting_it():
    runs = [{"mode": "coupled", "sessions": n, "batching": b, "per_session_tokens_per_s_p50": rate}
            for n, b, rate in ((1, True, 9.0), (2, True, 6.0), (4, True, 3.0), (8, False, 9.0))]
    assert capacity_at_slo(runs, 4.0) == {"coupled": 2}
    assert capacity_at_slo(runs, 10.0) == {"coupled": 0}


def test_replay_drafter_proposes_what_was_recorded_and_an_empty_block_otherwise():
    from edge.drafter import DraftBlock
    from shared.params import Mode, SamplingParams

    replay = ReplayDrafter({(0, 1, 2): DraftBlock([5, 6, 7]), (0, 1, 2, 5, 9): DraftBlock([4])}, vocab_size=16)
    replay.begin([1, 2], SamplingParams(mode=Mode.GREEDY, seed=0))
    assert replay.draft(2).tokens == [5, 6]
    replay.commit([5, 9])  # a correction at the second draft
    assert replay.draft(4).tokens == [4]
    assert replay.draft(4).tokens == [] and replay.misses == 1


@pytest.mark.slow
def test_bench_capacity_soak_reports_no_errors_no_leaks_and_a_plot(tmp_path):
    out = subprocess.run([*SPLITSPEC, "bench", "capacity", "--tiny", "--soak", "0.25", "--sessions", "4",
                          "--max-new-tokens", "12", "--out", str(tmp_path), "--json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["completed"] > 0 and report["errors"] == 0 and report["different"] == 0
    assert report["leaked_sessions"] == 0 and len(report["rss_mb"]) >= 3
    assert report["verdict_latency"] and Path(report["plot"]).stat().st_size > 1000


def test_modelled_capacity_never_has_the_split_below_cloud_only_and_says_where_it_stops_paying():
    profile = load_hardware("llama70b-8xh100-mac")
    link = NetworkModel.from_link_config(load_scenario("acespec-50k").link)
    rows = capacity_rows(profile, link, sessions=(1, 8, 64, 512))
    for row in rows:
        assert row["split_tokens_per_s"] >= row["cloud_only_tokens_per_s"] - 1e-9
        assert row["cloud_only_cloud_s_per_token"] == pytest.approx(profile.batch_forward_s(row["sessions"]) / row["sessions"])
    # Past the ridge a forward grows with its rows: per-session rates fall.
    assert rows[-1]["cloud_only_tokens_per_s"] < rows[0]["cloud_only_tokens_per_s"]
    summary = modelled_capacity_at_slo(rows, 15.0)
    assert summary["split"] >= summary["cloud-only"] >= 1


def test_sim_model_prints_the_capacity_table_labelled_modelled():
    out = subprocess.run([*SPLITSPEC, "sim", "model", "--hardware", "llama70b-8xh100-mac", "--slo", "15", "--json"],
                         capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(out.stdout)
    assert report["kind"] == "modelled" and report["capacity"]["slo_tokens_per_s"] == 15
    assert report["capacity"]["ridge_rows"] == 300 and len(report["capacity"]["rows"]) >= 5


@pytest.mark.slow
def test_the_gpu_check_script_runs_its_cpu_variant():
    env = dict(os.environ, DEVICE="cpu", DTYPE="float32", TINY="1", SESSIONS="1 2", TOKENS="8",
               SPLITSPEC=str(Path(sys.executable).with_name("splitspec")))
    out = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True, text=True,
                         timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "bit_identical: True" in out.stdout and "capacity at 4 tokens/s" in out.stdout
