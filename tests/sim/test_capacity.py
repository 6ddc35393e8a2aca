"""Capacity: the bench (real verifier process, replayed real drafts), the soak, the modelled table, the GPU check;
and the yardstick of every bench ratio: the fastest cloud-only (free shapes) measured in the same run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sim.bench.bench_sessions import ReplayDrafter
from sim.bench.capacity import CapacityBench, capacity_at_slo, format_capacity_report, run_capacity_bench
from sim.link.scenario import load_scenario
from sim.perf.capacity import capacity_at_slo as modelled_capacity_at_slo
from sim.perf.capacity import capacity_rows
from sim.perf.hardware_profile import load_hardware
from sim.perf.model import NetworkModel

ROOT = Path(__file__).resolve().parents[2]
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
    # Cloud-only runs in its fastest shapes, the split in batch-invariant ones; so does the comparison.
    assert {(r["mode"], r["shapes"]) for r in runs} == {("cloud-only", "free"), ("coupled", "canonical")}
    assert report["compared_shapes"] == {"cloud-only": "free", "coupled": "canonical"}
    # The SLO is half the lone cloud-only rate in free shapes, measured in the same run.
    fastest, reproducible = report["fastest_cloud_only_alone"], report["reproducible_cloud_only_alone"]
    assert (fastest["shapes"], reproducible["shapes"]) == ("free", "canonical") and fastest["sessions"] == 3
    assert fastest["tokens_per_s"] > 0 and reproducible["tokens_per_s"] > 0
    assert report["slo_fraction"] == 0.5
    assert report["slo_tokens_per_s"] == pytest.approx(0.5 * fastest["tokens_per_s"])
    slo = report["slo_tokens_per_s"]
    for mode, shapes in report["compared_shapes"].items():
        meeting = [r["sessions"] for r in runs if (r["mode"], r["shapes"], r["batching"]) == (mode, shapes, True)
                   and r["per_session_tokens_per_s_p50"] >= slo]
        assert report["capacity_at_slo"][mode] == max(meeting, default=0)
    assert report["capacity_at_slo"]["cloud-only"] >= 1  # one session alone makes twice the SLO
    text = format_capacity_report(report)
    assert f"SLO: {slo:.3g} tokens/s per session (p50), 0.5 x the fastest lone cloud-only" in text
    assert f"{fastest['tokens_per_s']:.2f} tokens/s in free shapes (the fastest)" in text
    assert (f"capacity at {slo:.3g} tokens/s per session (p50), both batched, cloud-only in free shapes (its fastest) "
            "against coupled in canonical shapes (batch-invariant): cloud-only ") in text
    for run in runs:
        assert not run["errors"] and run["replay_misses"] == 0, run
        assert run["identical"] or run["shapes"] == "free", run  # free shapes' identity is luck
        assert run["aggregate_tokens_per_s"] > 0 and run["per_session_tokens_per_s_p10"] <= run["per_session_tokens_per_s_p50"]
        assert 0 < run["verifier_busy"] <= 1.0 and run["cloud_cpu_s_per_token"] > 0
        if not run["batching"]:
            assert run["mean_batch_sessions"] == 1.0
    coupled = [r for r in runs if r["mode"] == "coupled"]
    assert all(r["cloud_forwards_per_token"] < 1 for r in coupled)  # drafts were accepted
    assert 0 < report["acceptance"]["coupled"] < 1 and report["verifier_cores"] is not None


def test_capacity_at_slo_is_the_largest_batched_count_meeting_it_in_each_sides_shapes():
    runs = [{"mode": "coupled", "sessions": n, "batching": b, "per_session_tokens_per_s_p50": rate}
            for n, b, rate in ((1, True, 9.0), (2, True, 6.0), (4, True, 3.0), (8, False, 9.0))]
    assert capacity_at_slo(runs, 4.0) == {"coupled": 2}
    assert capacity_at_slo(runs, 10.0) == {"coupled": 0}
    # Cloud-only counts in free shapes only (its fastest), the split in canonical only.
    runs = [{"mode": mode, "sessions": n, "batching": True, "shapes": shapes, "per_session_tokens_per_s_p50": rate}
            for mode, shapes, n, rate in (("cloud-only", "free", 2, 5.0), ("cloud-only", "canonical", 4, 5.0),
                                          ("coupled", "free", 8, 5.0), ("coupled", "canonical", 1, 5.0))]
    assert capacity_at_slo(runs, 4.0) == {"cloud-only": 2, "coupled": 1}


def test_capacity_slo_flags_default_to_a_fraction_of_the_lone_rate_and_bad_ones_fail_before_any_model_loads():
    import argparse

    from sim.commands.bench import add_bench_commands

    parser = argparse.ArgumentParser()
    add_bench_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["capacity"])
    assert (args.slo, args.slo_fraction) == (None, 0.5)
    assert parser.parse_args(["capacity", "--slo", "4"]).slo == 4.0
    with pytest.raises(SystemExit):
        parser.parse_args(["capacity", "--slo-fraction", "0"])
    for kwargs in ({"slo_fraction": 1.5}, {"slo": -1.0}, {"cloud_args": ["--shapes", "free"]}):
        with pytest.raises(ValueError):
            run_capacity_bench(CapacityBench(tiny=True, **kwargs))


def test_capacity_report_says_which_slo_it_used():
    report = {"runs": [], "acceptance": {"coupled": 0.8}, "capacity_at_slo": {"cloud-only": 1, "coupled": 2},
              "drafter": "replayed", "draft_len": 8, "slo_tokens_per_s": 4.0, "slo_fraction": None,
              "fastest_cloud_only_alone": {"shapes": "free", "tokens_per_s": 3.0, "sessions": 3},
              "reproducible_cloud_only_alone": {"shapes": "canonical", "tokens_per_s": 2.3, "sessions": 3},
              "compared_shapes": {"cloud-only": "free", "coupled": "canonical"}}
    text = format_capacity_report(report)
    assert "SLO: 4 tokens/s per session (p50), set by --slo" in text
    assert "3.00 tokens/s in free shapes (the fastest), 2.30 in canonical shapes (reproducible)" in text
    assert text.endswith("cloud-only 1, coupled 2")


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
        assert row["cloud_only_cloud_s_per_token"] == pytest.approx(profile.batch_forward_s(row["sessions"], row["sessions"]) / row["sessions"])
    # Past the ridge a forward grows with its rows: per-session rates fall.
    assert rows[-1]["cloud_only_tokens_per_s"] < rows[0]["cloud_only_tokens_per_s"]
    summary = modelled_capacity_at_slo(rows, 15.0)
    assert summary["split"] >= summary["cloud-only"] >= 1


@pytest.mark.slow
def test_sim_model_prints_the_capacity_table_labelled_modelled():
    out = subprocess.run([*SPLITSPEC, "sim", "model", "--hardware", "llama70b-8xh100-mac", "--slo", "15", "--json"],
                         capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(out.stdout)
    assert report["kind"] == "modelled" and report["capacity"]["slo_tokens_per_s"] == 15
    assert report["capacity"]["ridge_rows"] == 300 and len(report["capacity"]["rows"]) >= 5


def test_the_gpu_check_script_runs_its_cpu_dry_run(tmp_path):
    """``scripts/gpu_check.sh`` at tiny shapes on the CPU: every section runs, canonical rows are bit-identical,
    the service's sessions match target-only; the report says what it measured."""
    env = dict(os.environ, DEVICE="cpu", OUT_DIR=str(tmp_path), PYTHON=sys.executable)
    out = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", "--repeats", "2"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-2000:]
    sections = json.loads((tmp_path / "gpu_check.json").read_text())["sections"]
    assert not [name for name, section in sections.items() if "error" in section or "skipped" in section]
    assert sections["identity_8b"]["canonical"]["bit_identical"] and sections["identity_8b"]["canonical"]["trials"] == 3
    assert sections["rows_8b"]["one_session_free"].keys() == sections["rows_8b"]["one_session_canonical"].keys()
    assert len(sections["rows_8b"]["batched"]) == 6 and sections["rows_70b"]["layers"] == 8
    assert all(sections[name]["all_identical"] and sections[name]["sessions"] == 8 for name in ("service", "service_8b"))
    assert "gpu check on cpu/float32" in out.stdout


def test_bench_invariance_reports_the_row_tile_the_engine_chose(monkeypatch):
    import cloud.engine
    from cloud.invariance.padding import RowPadding
    from sim.bench.invariance import run_invariance_check

    monkeypatch.setattr(cloud.engine, "invariant_row_padding", lambda model, max_rows=64: RowPadding(True, tile=16))
    report = run_invariance_check(tiny=True, trials=1)
    assert (report["row_padding"], report["row_tile"]) == ("a multiple of 16 rows", 16)


def test_bench_split_compares_every_run_with_the_fastest_cloud_only_and_labels_both(tiny_models):
    from sim.bench.split import SplitBench, format_split_report, run_split_bench

    seen = []
    result = run_split_bench(SplitBench(target=tiny_models["target"], drafter=tiny_models["drafter_noisy"],
                                        prompt="hello there", max_new_tokens=12, modes=["greedy", "coupled"],
                                        draft_lens=[3]), on_row=seen.append)
    rows = result["runs"]
    assert seen == rows
    assert [(r["mode"], r["draft_len"], r["shapes"]) for r in rows] == [
        (mode, d, shapes) for mode in ("greedy", "coupled") for d, shapes in ((0, "free"), (0, "canonical"), (3, "canonical"))]
    fastest, reproducible = result["cloud_only"]["fastest"], result["cloud_only"]["reproducible"]
    assert (fastest["shapes"], reproducible["shapes"]) == ("free", "canonical") and result["split_shapes"] == "canonical"
    assert fastest["threads"] == reproducible["threads"] >= 1 and all(r["threads"] == fastest["threads"] for r in rows)
    for mode in ("greedy", "coupled"):
        free, canonical, split = (r for r in rows if r["mode"] == mode)
        assert free["wall_vs_fastest_cloud_only"] == 1.0 and canonical["wall_vs_target_only"] == 1.0
        # Each ratio is over its own baseline: their quotient is the reproducible's wall over the fastest's.
        price = canonical["wall_vs_fastest_cloud_only"]
        assert split["wall_vs_fastest_cloud_only"] / split["wall_vs_target_only"] == pytest.approx(price, rel=0.02)
        assert free["wall_vs_target_only"] * price == pytest.approx(1.0, rel=0.02)
        assert split["identical_to_target_only"] and canonical["identical_to_target_only"]
    text = format_split_report(result)
    assert text.splitlines()[0].startswith(f"cloud-only (D=0, same process, {fastest['threads']} torch threads): "
                                           "the fastest in free shapes")
    assert "(cloud-only, free shapes)" in text and "(split, canonical shapes)" in text
    assert "of the fastest cloud-only" in text


@pytest.mark.slow
def test_bench_serve_compares_the_split_with_the_fastest_cloud_only_on_the_same_link(tiny_models):
    from sim.bench.serve import ServeBench, format_serve_report, run_serve_bench

    report = run_serve_bench(ServeBench(scenario="lte", turns=2, max_tokens=8, repeats=1, target=tiny_models["target"],
                                        drafter=tiny_models["drafter_noisy"], schedule="adaptive",
                                        concurrency=(1, 3)))
    c = report["cloud_only"]
    assert (c["fastest"]["shapes"], c["reproducible"]["shapes"], c["split_shapes"]) == ("free", "canonical", "canonical")
    assert c["fastest"]["tokens_per_s"] > 0 and c["reproducible"]["tokens_per_s"] > 0
    direct = report["http"]["direct_tokens_per_s"]
    assert c["direct_over_fastest"] == pytest.approx(direct / c["fastest"]["tokens_per_s"])
    assert c["direct_over_reproducible"] == pytest.approx(direct / c["reproducible"]["tokens_per_s"])
    assert all(t["identical"] for t in report["turns"]) and all(t["kept_tokens_per_s"] > 0 for t in report["turns"])
    load = report["load"]
    assert [row["conversations"] for row in load] == [1, 3] and [row["requests"] for row in load] == [2, 6]
    assert all(row["refused"] == 0 and row["tokens"] > 0 and row["ttft_s"]["max"] <= row["latency_s"]["max"]
               for row in load)
    assert load[1]["ttft_s"]["max"] > load[0]["ttft_s"]["median"]  # three at once: someone waited
    text = format_serve_report(report)
    assert "edge serve under concurrent conversations" in text
    assert report["lookup"] and "the drafter behind prompt lookup, the adaptive schedule; kept arm median" in text
    assert f"vs {c['fastest']['tokens_per_s']:.2f} tok/s in free shapes, the fastest ({c['direct_over_fastest']:.2f}x)" in text


def test_the_shipped_h200_profiles_are_what_the_committed_gpu_check_makes():
    """The H200 profiles are generated from the committed report (``sim.bench.gpu_profiles``), never edited."""
    from sim.bench.gpu_profiles import profiles_from_report
    from sim.perf.hardware_profile import load_hardware

    source = "docs/results/2026-12-04-gpu-check/h200.json"
    made = profiles_from_report(json.loads((ROOT / source).read_text()), source)
    for name, text in made.items():
        assert (ROOT / "sim" / "perf" / "hardware" / name).read_text() == text
    eight = load_hardware("h200-llama8b")
    assert eight.verify_per_sequence_ms > 1 and eight.ridge_rows > 100 and eight.vocab_size == 128256
    assert eight.batch_forward_s(8, sequences=8) == pytest.approx(eight.batch_forward_s(8) + 7 * eight.verify_per_sequence_ms / 1e3)


def test_sim_model_sets_several_profiles_side_by_side():
    out = subprocess.run([sys.executable, "-m", "sim.cli", "sim", "model", "--hardware", "llama70b-8xh100-mac",
                          "h200-llama70b"], capture_output=True, text=True, timeout=120, check=True, cwd=ROOT)
    table = out.stdout.split("\n\n")[1]
    assert "llama70b-8xh100-mac" in table and "h200-llama70b" in table and "+ms a session" in table
    assert [line.split(" on ")[0] for line in out.stdout.splitlines() if line.startswith("MODELLED, not measured: ")][:3] == [
        "MODELLED, not measured: the profiles side by side", "MODELLED, not measured: llama70b-8xh100-mac",
        "MODELLED, not measured: h200-llama70b"]  # the comparison, then each report
