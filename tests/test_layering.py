"""The package layering of DESIGN.md holds: edge and cloud meet only in shared and protos."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {
    "protos": {"protos"},
    "shared": {"shared", "protos"},
    "edge": {"edge", "shared", "protos"},
    "cloud": {"cloud", "shared", "protos"},
    "sim": {"sim", "edge", "cloud", "shared", "protos"},
}
NO_TORCH = {"protos", "shared", "edge"}  # the edge installs without torch


def imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_packages_import_only_what_the_design_allows():
    problems = []
    for package, allowed in ALLOWED.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            imports = imported_top_levels(path)
            for other in (set(ALLOWED) & imports) - allowed:
                problems.append(f"{path.relative_to(ROOT)} imports {other}")
            if package in NO_TORCH and imports & {"torch", "transformers"}:
                problems.append(f"{path.relative_to(ROOT)} imports torch/transformers")
    assert not problems, "\n".join(problems)
