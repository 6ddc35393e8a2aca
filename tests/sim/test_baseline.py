"""The result record as a test: ``docs/results/baseline.md`` and the README's Results region are what
``splitspec results baseline`` makes of the committed result files, a hand edit fails ``--check``, and
every link into ``docs/results/`` names a file. Files only: no model, no process."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

import sim.cli
from sim.experiment.baseline import BASELINE, dangling_result_links, parse_baseline, refresh, render_baseline
from sim.experiment.readme_results import FOLDERS, render_region, template_keys
from sim.experiment.record import ResultFile, read_provenance
from sim.experiment.record_figures import folder_figures

ROOT = Path(__file__).resolve().parents[2]
EPYC = FOLDERS["epyc"]


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of the README and the record, to edit."""
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(ROOT / "docs" / "results", tmp_path / "docs" / "results")
    return tmp_path


def check(root: Path) -> int:
    return sim.cli.main(["results", "baseline", "--check", "--root", str(root)])


def test_the_committed_baseline_and_readme_are_what_the_files_give():
    assert refresh(ROOT, check=True) == []
    assert check(ROOT) == 0


def test_every_link_into_the_record_names_a_file():
    assert dangling_result_links(ROOT) == []


def test_the_readme_quotes_only_figures_baseline_md_holds_and_names_the_machines():
    figures = parse_baseline((ROOT / BASELINE).read_text())
    for folder, names in template_keys().items():
        assert names <= set(figures[folder]), folder
    readme = (ROOT / "README.md").read_text()
    assert render_region(figures) in readme
    assert "AMD EPYC" in readme and "Intel(R) Xeon(R) Processor" in readme
    assert figures[EPYC]["acespec-50k/default/auto/speedup"] == "2.02×"  # the median of 2.02, 2.26, 1.94


def test_the_readme_links_each_quoted_folder_through_its_alias():
    region = render_region(parse_baseline((ROOT / BASELINE).read_text()))
    assert set(re.findall(r"docs/results/(\d{4}-[^/)\s]+)", region)) == set(FOLDERS.values())


def test_a_hand_edited_figure_fails_the_check_and_the_command_restores_it(checkout, capsys):
    baseline = checkout / BASELINE
    committed = baseline.read_text()
    row = "| `acespec-50k/default/auto/speedup` | 2.02× |"
    assert row in committed
    baseline.write_text(committed.replace(row, "| `acespec-50k/default/auto/speedup` | 2.12× |"))
    assert check(checkout) == 1
    assert "out of date with the result files: docs/results/baseline.md" in capsys.readouterr().err
    assert refresh(checkout, check=False) == ["docs/results/baseline.md"]
    assert baseline.read_text() == committed and refresh(checkout, check=False) == []  # idempotent


def test_a_hand_edited_readme_figure_fails_the_check(checkout):
    readme = checkout / "README.md"
    readme.write_text(readme.read_text().replace("| **2.02×** (1.94–2.26) |", "| **2.20×** (1.94–2.26) |", 1))
    assert refresh(checkout, check=True) == ["README.md"]
    assert check(checkout) == 1


def test_a_changed_result_file_changes_both_generated_files(checkout):
    run = checkout / "docs" / "results" / EPYC / "acespec-2026-12-03-epyc-run2.json"
    data = json.loads(run.read_text())
    data["headlines"]["default"]["auto"]["median"] = 1.5  # 2.26 before: runs 1-3 now 2.02, 1.50, 1.94
    run.write_text(json.dumps(data))
    assert refresh(checkout, check=True) == ["docs/results/baseline.md", "README.md"]
    refresh(checkout, check=False)
    assert parse_baseline((checkout / BASELINE).read_text())[EPYC]["acespec-50k/default/auto/speedup"] == "1.94×"
    assert "**1.94×** (1.50–2.02)" in (checkout / "README.md").read_text()


def test_a_quoted_folder_that_is_gone_is_an_error(checkout):
    shutil.rmtree(checkout / "docs" / "results" / FOLDERS["capacity"])
    with pytest.raises(ValueError, match="quotes folders not in"):
        render_baseline(checkout / "docs" / "results")
    assert check(checkout) == 2  # one line, no traceback


def test_a_dangling_link_is_found_and_a_git_history_path_is_not(checkout):
    (checkout / "docs" / "notes.md").write_text(
        "[gone](results/demo-2026-12-02-summary.md) and "
        "`docs/results/2026-12-03-capacity/{capacity-2026-12-03,x}.json`\n"
        "in history: `git show b2b5c1c:docs/results/demo-2026-12-02-summary.md`; "
        "[kept](results/2026-12-03-capacity/capacity-2026-12-03.json)\n")
    assert dangling_result_links(checkout) == [
        ("docs/notes.md:1", "results/demo-2026-12-02-summary.md"),
        ("docs/notes.md:1", "docs/results/2026-12-03-capacity/{capacity-2026-12-03,x}.json")]
    assert check(checkout) == 1


def sim_run(name: str, medians: dict[str, float], provenance: dict | None) -> ResultFile:
    """A sim run's result.json, cut down to what the figures read."""
    runs = [{"label": f"{drafter}: coupled", "ratios": {"cloud_cpu_s_per_token": 0.5}} for drafter in medians]
    data = {"scenario": "wan", "link": {"rtt_ms": 14.0}, "runs": runs,
            "baselines": {"fastest": {"tokens_per_s": 10.0}, "reproducible": None},
            "headlines": {drafter: {"auto": {"config": f"{drafter}: coupled", "median": median,
                                             "identical_to_fastest": True}} for drafter, median in medians.items()}}
    if provenance is not None:
        data["provenance"] = provenance
    return ResultFile("2026-12-03-wan", name, data, read_provenance(data))


def test_sim_run_figures_are_medians_over_runs_and_missing_provenance_stays_missing():
    made = {"command": "splitspec sim run wan", "commit": "0123456789abcdef", "date": "2026-12-03 09:00 UTC",
            "machine": "2 cores, Some CPU"}
    files = [sim_run("run1.json", {"default": 1.5}, made), sim_run("run2.json", {"default": 2.5}, made),
             sim_run("run3.json", {"default": 1.9}, None)]
    figures = {figure.key: figure for figure in folder_figures(files)}
    assert figures["wan/default/auto/speedup"].value == "1.90×"
    assert figures["wan/default/auto/speedup-range"].value == "1.50–2.50"
    assert figures["wan/default/auto/runs"].value == "3" and figures["wan/rtt"].value == "14 ms"
    assert figures["wan/default/auto/identical"].value == "3 of 3"
    assert figures["machine"].value == "2 cores, Some CPU" and figures["commits"].value == "`0123456`"
    assert "wan/cloud-only/reproducibility-price" not in figures  # no reproducible baseline: no price
    assert files[2].provenance.missing == ["command", "commit", "date", "machine"]
