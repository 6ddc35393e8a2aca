"""The architecture as tests: the package layering of DESIGN.md, and one home per concern.

- edge and cloud meet only in shared and protos; the edge never imports sim or torch;
- argparse lives only in the command-line modules;
- the wire contract (framing sizes, message caps, channel options) is defined only in ``shared.wire``;
- no import circle between the product's modules (imports inside functions count: a lazy import
  hides a circle from Python, not from the design).
"""

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
# Command-line modules: the only ones that parse flags.
CLI_NAMES = {"cli.py", "cli_options.py"}
CLI_FOLDERS = {ROOT / "sim" / "commands"}
CLI_SCRIPTS = {ROOT / "protos" / "generate.py"}  # `make protos`: the generator's own command line
WIRE_HOME = ROOT / "shared" / "wire.py"
WIRE_NAMES = ("PREFIX_BYTES", "FRAME_HEADER", "MAX_MESSAGE_BYTES", "FRAMING")
GRPC_OPTION_PREFIX = "grpc."  # channel and server options ("grpc.max_receive_message_length", ...)


def product_files():
    for package in ALLOWED:
        for path in sorted((ROOT / package).rglob("*.py")):
            if not path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                yield package, path


def imported_top_levels(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each product module -> the product modules it imports (``from a import b`` counts as a.b
    where b is a module, else as a)."""
    paths = {module_name(path): path for _, path in product_files()}

    def known(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in paths.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(known(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets.update(known(f"{node.module}.{alias.name}") for alias in node.names)
        graph[name] = targets - {None, name}
    return graph


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` as [a, b, ..., a], or None (depth-first, three colours)."""
    done: set[str] = set()
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        if name in path:
            return path[path.index(name):] + [name]
        if name in done:
            return None
        path.append(name)
        for target in sorted(graph[name]):
            if circle := visit(target):
                return circle
        path.pop()
        done.add(name)
        return None

    return next((circle for name in sorted(graph) if (circle := visit(name))), None)


def is_cli_module(path: Path) -> bool:
    return path.name in CLI_NAMES or any(path.is_relative_to(folder) for folder in CLI_FOLDERS) or path in CLI_SCRIPTS


def test_packages_import_only_what_the_design_allows():
    problems = []
    for package, path in product_files():
        imports = imported_top_levels(ast.parse(path.read_text(), filename=str(path)))
        for other in (set(ALLOWED) & imports) - ALLOWED[package]:
            problems.append(f"{path.relative_to(ROOT)} imports {other}")
        if package in NO_TORCH and imports & {"torch", "transformers"}:
            problems.append(f"{path.relative_to(ROOT)} imports torch/transformers")
    assert not problems, "\n".join(problems)


def test_no_import_circle_between_modules():
    graph = import_graph()
    assert "cloud.engine" in graph["cloud.tensor_parallel"]  # the walk resolves imports (no vacuous pass)
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    circle = find_circle(graph)
    assert circle is None, "import circle: " + " -> ".join(circle)


def test_only_command_line_modules_import_argparse():
    offenders = [
        str(path.relative_to(ROOT))
        for _, path in product_files()
        if "argparse" in imported_top_levels(ast.parse(path.read_text())) and not is_cli_module(path)
    ]
    assert not offenders, f"argparse outside the command-line modules: {offenders}"


def test_the_wire_contract_is_defined_only_in_shared_wire():
    problems = []
    for _, path in product_files():
        if path == WIRE_HOME:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and any(word in target.id for word in WIRE_NAMES):
                        problems.append(f"{path.relative_to(ROOT)}:{node.lineno} defines {target.id}")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(GRPC_OPTION_PREFIX):
                problems.append(f"{path.relative_to(ROOT)}:{node.lineno} sets gRPC option {node.value!r}")
    assert not problems, "define these in shared/wire.py and import them:\n" + "\n".join(problems)


def test_the_rule_checks_see_real_files():
    """Guard against a vacuous pass: the walks above cover every package and find the known CLI modules."""
    files = {path for _, path in product_files()}
    assert {ROOT / "edge" / "cli.py", ROOT / "cloud" / "cli.py", ROOT / "sim" / "cli.py", WIRE_HOME} <= files
    assert {package for package, _ in product_files()} == set(ALLOWED)
    wire_tree = ast.parse(WIRE_HOME.read_text())
    defined = set()
    for node in ast.walk(wire_tree):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined.update(t.id for t in targets if isinstance(t, ast.Name))
    assert {"GRPC_PREFIX_BYTES", "HTTP2_FRAME_HEADER_BYTES", "MAX_MESSAGE_BYTES", "CHANNEL_OPTIONS"} <= defined
