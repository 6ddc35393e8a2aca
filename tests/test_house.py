"""The house's limits as a test: rooms stay small, objects narrow, signatures short.

- no product file over ``MAX_FILE_LINES`` lines;
- no class over ``MAX_ATTRIBUTES`` instance attributes, unless it is a record (a dataclass);
- no product function over ``MAX_PARAMETERS`` parameters;
- no bench function (``sim/bench/``) over ``MAX_BENCH_FUNCTION_LINES`` lines.

What breaks a limit today is listed below with its reason; an entry that no longer breaks its limit
fails too, so the list only shrinks (``CONTRIBUTING.md``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("edge", "cloud", "shared", "sim", "protos")
MAX_FILE_LINES = 450
MAX_ATTRIBUTES = 20
MAX_PARAMETERS = 8
MAX_BENCH_FUNCTION_LINES = 80

# name -> why it may break its limit (for now)
WIDE_CLASSES: dict[str, str] = {}
LONG_SIGNATURES: dict[str, str] = {}


def product_files():
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            if not path.name.endswith(("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")):
                yield path


def named(path: Path, name: str) -> str:
    return f"{path.relative_to(ROOT)}:{name}"


def is_record(node: ast.ClassDef) -> bool:
    return any((isinstance(d, ast.Name) and d.id == "dataclass")
               or (isinstance(d, ast.Call) and getattr(d.func, "id", None) == "dataclass") for d in node.decorator_list)


def instance_attributes(node: ast.ClassDef) -> set[str]:
    return {sub.attr for sub in ast.walk(node)
            if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store)
            and isinstance(sub.value, ast.Name) and sub.value.id == "self"}


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = node.args
    count = len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs)
    return count - (1 if args.args and args.args[0].arg in ("self", "cls") else 0)


def measure() -> tuple[list[str], dict[str, int], dict[str, int], list[str]]:
    long_files, wide, signatures, long_bench = [], {}, {}, []
    for path in product_files():
        source = path.read_text()
        if source.count("\n") > MAX_FILE_LINES:
            long_files.append(str(path.relative_to(ROOT)))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef) and not is_record(node):
                if len(instance_attributes(node)) > MAX_ATTRIBUTES:
                    wide[named(path, node.name)] = len(instance_attributes(node))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if parameters(node) > MAX_PARAMETERS:
                    signatures[named(path, node.name)] = parameters(node)
                bench = path.is_relative_to(ROOT / "sim" / "bench")
                if bench and node.end_lineno - node.lineno + 1 > MAX_BENCH_FUNCTION_LINES:
                    long_bench.append(named(path, node.name))
    return long_files, wide, signatures, long_bench


def test_no_product_file_over_the_limit():
    assert measure()[0] == []


def test_no_wide_class_but_those_listed_and_every_listed_one_still_wide():
    assert set(measure()[1]) == set(WIDE_CLASSES)


def test_no_long_signature_but_those_listed_and_every_listed_one_still_long():
    assert set(measure()[2]) == set(LONG_SIGNATURES)


def test_no_long_bench_function():
    assert measure()[3] == []


def test_the_checks_see_real_code():
    """The control: the measures find what they look for (a limit of 0 would flag everything)."""
    path = ROOT / "cloud" / "session.py"
    tree = ast.parse(path.read_text())
    session = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "VerifierSession")
    assert 10 < len(instance_attributes(session)) <= MAX_ATTRIBUTES
    init = next(n for n in session.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    assert parameters(init) == 7
    assert sum(1 for _ in product_files()) > 100
