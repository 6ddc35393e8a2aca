"""``splitspec sim run`` end to end: real cloud and edge processes through the link emulator."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # real processes end to end: about 100 s

RUN_KEYS = {
    "mode", "draft_len", "tokens_per_s", "ttft_s", "acceptance_length", "up_bytes_per_token", "down_bytes_per_token",
    "cloud_forwards_per_token", "cloud_cpu_s_per_token", "identical_to_baseline", "predicted_tokens_per_s",
    "schedule", "window", "hedge", "mean_draft_len", "hedge_hit_rate", "stale_blocks", "stale_decoded",
    "rebased_verified", "rebased_accepted", "ttft_cloud_s", "per_prompt_tokens_per_s", "ratios", "ratios_vs_reproducible",
    "prediction_error_out_of_sample", "cloud_one_row_step_s",
}
CONFIGS = [(reproducible, mode, 3, schedule, window) for reproducible in (False, True) for mode in ("greedy", "coupled")
           for schedule, window in (("lockstep", 1), ("pipelined", 3), ("adaptive", 3))]
LABELS = ["greedy D=3", "greedy D=3 W=3", "greedy adaptive D<=3 W=3", "coupled D=3", "coupled D=3 W=3",
          "coupled adaptive D<=3 W=3"]


@pytest.fixture(scope="module")
def sim_result(tiny_models, tmp_path_factory):
    out = tmp_path_factory.mktemp("sim")
    prompts = out / "prompts.txt"
    prompts.write_text("The cat sat on the mat.\nWe have 3 dogs and 12 cats!\n")  # two: one fits, one is predicted
    proc = subprocess.run(
        [sys.executable, "-m", "sim.cli", "sim", "run", "acespec-50k", "--quick", "--prompts", str(prompts),
         "--modes", "greedy", "coupled",
         "--draft-lens", "3", "--schedules", "lockstep", "pipelined", "adaptive", "--window", "3", "--max-new-tokens", "24", "--target", tiny_models["target"],
         "--drafter", tiny_models["drafter_noisy"], "--out", str(out), "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout), out, proc.stderr


def test_result_schema_and_files(sim_result):
    result, out, _ = sim_result
    assert result["scenario"] == "acespec-50k"
    assert RUN_KEYS <= set(result["baseline"])
    baselines = result["baselines"]
    assert set(baselines) == {"fastest", "reproducible", "fastest_greedy", "reproducible_greedy"}
    assert baselines["fastest"]["shapes"] == baselines["fastest_greedy"]["shapes"] == "free"
    assert baselines["reproducible"]["shapes"] == baselines["reproducible_greedy"]["shapes"] == "canonical"
    assert result["baseline"] == baselines["fastest"]
    assert [(r["reproducible"], r["mode"], r["draft_len"], r["schedule"], r["window"]) for r in result["runs"]] == CONFIGS
    assert result["baseline"]["schedule"] is None and result["baseline"]["mean_draft_len"] is None
    for run in result["runs"]:
        assert RUN_KEYS <= set(run)
    assert json.loads((out / "result.json").read_text()) == result
    assert {r["drafter"] for r in result["runs"]} == {"drafter-noisy"}  # (the file's stem)
    colocated = result["colocated"]["drafter-noisy"]
    assert colocated["tokens_per_s"] > 0 and colocated["shapes"] == "free" and len(colocated["outputs"]) == 2
    heads = result["headlines"]["drafter-noisy"]
    assert set(heads) == {"auto", "reproducible"}
    for numerics, head in heads.items():
        assert head["prompts"] == 2 and head["min"] <= head["median"] <= head["max"]
        assert head["config"] in {r["label"] for r in result["runs"] if r["reproducible"] == (numerics != "auto")}
    assert heads["reproducible"]["identical_to_reproducible"] is True
    assert "Token identity" in (out / "report.md").read_text()
    assert "of it the cloud's own time (prefill included)" in (out / "report.md").read_text()
    assert "## Stale blocks" in (out / "report.md").read_text()  # the pipelined runs had some
    assert "the best configuration is predicted at" in (out / "report.md").read_text()
    for name in ("tokens_per_s.png", "acceptance_length.png", "uplink_bytes_per_token.png", "cloud_compute_per_token.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_ratio_is_against_the_fastest_cloud_only(sim_result):
    result, _, _ = sim_result
    baselines = result["baselines"]
    for run in [*result["runs"], *baselines.values()]:
        suffix = "_greedy" if run["mode"] == "greedy" or run.get("kind") == "greedy" else ""
        fastest, reproducible = baselines["fastest" + suffix], baselines["reproducible" + suffix]
        assert run["ratios"]["tokens_per_s"] == pytest.approx(run["tokens_per_s"] / fastest["tokens_per_s"])
        assert run["ratios_vs_reproducible"]["tokens_per_s"] == pytest.approx(
            run["tokens_per_s"] / reproducible["tokens_per_s"])
        # The machine's pace on one row against cloud-only's, where this run ran a step of one row.
        assert fastest["cloud_one_row_step_s"] > 0  # (cloud-only decodes every token in one)
        step = run["cloud_one_row_step_s"]
        assert run["ratios"]["cloud_one_row_step_s"] == (
            None if step is None else pytest.approx(step / fastest["cloud_one_row_step_s"]))
    assert any(run["cloud_one_row_step_s"] for run in result["runs"])  # (stale decodes, the cloud alone)
    for run in result["runs"]:  # fitted on one prompt, predicting the other
        assert run["prediction_error_out_of_sample"] is not None


def test_split_is_identical_to_cloud_only_and_cheaper(sim_result):
    result, _, _ = sim_result
    base = result["baselines"]["reproducible"]
    assert base["cloud_forwards_per_token"] >= 1.0
    for run in result["runs"]:
        # A reproducible session's tokens are reproducible cloud-only's; one that is not promises none.
        assert run["identical_to_baseline"] is (True if run["reproducible"] else None)
        assert isinstance(run["identical_to_fastest"], bool)
        if run["schedule"] == "adaptive":  # (its controller may hand the noisy drafter's session to the cloud)
            assert run["acceptance_length"] >= 1.0 and 0 <= run["mean_draft_len"] <= 3
            assert run["cloud_forwards_per_token"] <= base["cloud_forwards_per_token"]
        else:
            assert run["acceptance_length"] > 1.0 and 0 < run["mean_draft_len"] <= 3
            assert run["cloud_forwards_per_token"] < base["cloud_forwards_per_token"]
        assert run["up_bytes_per_token"] > 0 and run["down_bytes_per_token"] > 0
        assert run["hedge"] is None
        assert run["hedge_hit_rate"] is None or 0 <= run["hedge_hit_rate"] <= 1
        assert run["stale_decoded"] <= run["stale_blocks"] and 0 <= run["rebased_accepted"] <= run["rebased_verified"]
        if run["schedule"] == "lockstep":
            assert run["stale_blocks"] == 0
        elif run["schedule"] == "pipelined":
            assert run["stale_blocks"] > 0
        # (adaptive: 100 ms is worth some 25 of the tiny target's tokens, so it starts with the cloud alone, the
        # head start, and may never draft: no stale blocks to count on)
        assert run["predicted_tokens_per_s"] > 0 and run["prediction_error"] is not None
        # Beside an adaptive run's prediction (its controller's choice): the best configuration's.
        assert (run["predicted_best_tokens_per_s"] > 0) if run["schedule"] == "adaptive" else (
            run["predicted_best_tokens_per_s"] is None)
        # The machine's ceiling for this drafter, and how close the run came (rejections cost: below it).
        assert run["ceiling_tokens_per_s"] > 0 and 0 < run["efficiency"] == pytest.approx(
            run["tokens_per_s"] / run["ceiling_tokens_per_s"])
        # ... and per prompt, each after its first token against its own ceiling.
        each, prompts = run["per_prompt_efficiency"], len(run["per_prompt_tokens_per_s"])
        assert len(run["per_prompt_ceiling_tokens_per_s"]) == len(run["per_prompt_steady_tokens_per_s"]) == prompts
        assert each["prompts"] == prompts and 0 < each["min"] <= each["median"] <= each["max"]
        assert (each["best_schedule"] is not None) == (run["schedule"] == "adaptive")
    for run in [*result["baselines"].values(), *result["runs"]]:  # the cloud's share of the first token
        assert 0 < run["ttft_cloud_s"] < run["ttft_s"]


def test_the_fleet_reported_over_mqtt_through_the_link(sim_result):
    result, out, _ = sim_result
    fleet = result["fleet"]
    assert fleet["mqtt_up_bytes"] > 0 and fleet["mqtt_down_bytes"] > 0 and 0 < fleet["mqtt_uplink_share"] < 1
    cloud = fleet["view"]["clouds"]["sim-cloud"]
    assert cloud["status"]["state"] == "online" and cloud["load"]["suggested_max_draft_len"] >= 1
    edge = fleet["view"]["edges"]["sim-edge"]
    assert edge["status"]["state"] == "offline"  # the last edge process stopped cleanly
    assert edge["telemetry"]["tokens_per_s"] > 0 and edge["telemetry"]["D"] == 3
    assert "fleet: cloud sim-cloud online" in (out / "report.md").read_text()


def test_progress_is_shown(sim_result):
    _, _, stderr = sim_result
    assert "[1/" in stderr and "cloud ready" in stderr and "--shapes auto" in stderr


def test_terminal_and_markdown_tables_hold_the_same_rows(sim_result):
    from sim.experiment.report import markdown_report, terminal_table

    result, out, _ = sim_result
    markdown = (out / "report.md").read_text()
    assert markdown == markdown_report(result)
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| config"))
    md_rows = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))  # the results table
    assert md_rows[0].startswith("| config") and md_rows[1].startswith("|:-")
    md_cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in md_rows[2:]]
    labels = [cells[0] for cells in md_cells]
    assert labels[-12:] == LABELS + [label + " reproducible" for label in LABELS]
    assert set(labels[:-12]) == {"cloud-only", "cloud-only reproducible"}
    lines = terminal_table(result).splitlines()
    assert lines[0].split()[0] == "config" and set(lines[1]) == {"-", " "}
    assert [line.split() for line in lines[2:]] == [" ".join(cells).split() for cells in md_cells]
