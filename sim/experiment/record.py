"""The result record: ``docs/results/<date>-<question>/`` folders of result files, read as they are.

``read_record`` loads every JSON (and JSON Lines) file of every question folder with what made it: the
command, the commit, the date and the machine (its CPU model named), from the file's ``provenance``
block (``sim run``, ``bench categories``) or from the same keys at its top level (``bench capacity``,
``bench serve``). A file that records none of them says so: nothing is filled in from elsewhere (a
report's ``.md``, a summary, the git log). Files other than JSON are not read.

The figures computed from these files are ``sim.experiment.record_figures``'s.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FOLDER_NAME", "Provenance", "ResultFile", "Figure", "read_record", "short_commit"]

FOLDER_NAME = re.compile(r"^\d{4}-\d{2}-\d{2}-[a-z0-9][a-z0-9-]*$")  # <date>-<question>
PROVENANCE_KEYS = ("command", "commit", "date", "machine")


@dataclass(frozen=True)
class Provenance:
    """What made a result file, each field as recorded, None where the file does not record it."""

    command: str | None
    commit: str | None  # full or short, as written
    date: str | None
    machine: str | None  # "2 cores, <CPU model>" as ``sim.experiment.provenance`` writes it

    @property
    def missing(self) -> list[str]:
        """The fields the file does not record, in ``PROVENANCE_KEYS`` order."""
        return [key for key in PROVENANCE_KEYS if getattr(self, key) is None]


@dataclass(frozen=True)
class ResultFile:
    """One result file of a question folder: its name, its parsed content, its provenance."""

    folder: str  # "2026-12-03-acespec-epyc"
    name: str  # "acespec-2026-12-03-epyc-run1.json"
    data: dict | list  # the JSON; a JSON Lines file is the list of its records
    provenance: Provenance

    @property
    def link(self) -> str:
        """The file's path relative to ``docs/results/``."""
        return f"{self.folder}/{self.name}"


@dataclass(frozen=True)
class Figure:
    """A figure computed from result files: a name within its folder, the text as printed, its files."""

    key: str  # "acespec-50k/default/auto/speedup"
    value: str  # "2.02×"
    sources: tuple[ResultFile, ...]  # the files the value is computed from, in name order


def short_commit(commit: str | None) -> str | None:
    """A commit as 7 hex digits (a recorded short commit is kept as it is)."""
    return commit[:7] if commit else None


def read_provenance(data: dict | list) -> Provenance:
    """The provenance a parsed result file records: its ``provenance`` block, else top-level keys."""
    if not isinstance(data, dict):
        return Provenance(None, None, None, None)
    block = data.get("provenance")
    source = block if isinstance(block, dict) else data
    values = {key: source.get(key) if isinstance(source.get(key), str) else None for key in PROVENANCE_KEYS}
    return Provenance(**values)


def read_result_file(path: Path, folder: str) -> ResultFile:
    """Parse one ``.json`` or ``.jsonl`` file; raises ``ValueError`` naming the file when it does not parse."""
    text = path.read_text()
    try:
        if path.suffix == ".jsonl":
            data: dict | list = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{folder}/{path.name}: not JSON ({exc})") from exc
    return ResultFile(folder, path.name, data, read_provenance(data))


def read_record(results_dir: Path) -> dict[str, list[ResultFile]]:
    """Every question folder of ``results_dir`` (by name) -> its JSON files (by name).

    A folder whose name is not ``<date>-<question>`` or a file directly under ``results_dir`` other than
    the Markdown index and ``baseline.md`` is an error (``ValueError``): the record has one layout.
    """
    if not results_dir.is_dir():
        raise FileNotFoundError(f"no result record at {results_dir}")
    record: dict[str, list[ResultFile]] = {}
    for entry in sorted(results_dir.iterdir()):
        if entry.is_file():
            if entry.suffix != ".md":
                raise ValueError(f"{entry.name}: a result file outside a <date>-<question> folder")
            continue
        if not FOLDER_NAME.match(entry.name):
            raise ValueError(f"{entry.name}/: a folder not named <date>-<question>")
        record[entry.name] = [read_result_file(path, entry.name) for path in sorted(entry.iterdir())
                              if path.suffix in (".json", ".jsonl")]
    return record
