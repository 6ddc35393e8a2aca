"""Regenerate the Python code for ``splitspec.proto``: the one command for it.

    python -m protos.generate          # rewrite protos/splitspec_pb2{.py,.pyi,_grpc.py}
    python -m protos.generate --check  # exit 1 if the committed files differ

Runs ``grpc_tools.protoc`` with ``-I protos --python_out --pyi_out
--grpc_python_out``, then rewrites the grpc module's top-level
``import splitspec_pb2`` into ``from protos import splitspec_pb2`` so the code
imports as part of the ``protos`` package. The output depends only on the
.proto and the grpcio-tools version, never on the working directory.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

__all__ = ["GENERATED", "PROTO_DIR", "PROTO_FILE", "drifted", "generate"]

PROTO_DIR = Path(__file__).resolve().parent
PROTO_FILE = "splitspec.proto"
GENERATED = ("splitspec_pb2.py", "splitspec_pb2.pyi", "splitspec_pb2_grpc.py")

_BARE_IMPORT = re.compile(r"^import splitspec_pb2 as (\w+)$", re.MULTILINE)


def generate(out_dir: Path, proto_dir: Path = PROTO_DIR) -> list[Path]:
    """Write the three generated files into ``out_dir``; return their paths."""
    from grpc_tools import protoc

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{proto_dir}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(Path(proto_dir) / PROTO_FILE),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {proto_dir / PROTO_FILE}")
    grpc_module = out_dir / "splitspec_pb2_grpc.py"
    text = grpc_module.read_text()
    fixed, count = _BARE_IMPORT.subn(r"from protos import splitspec_pb2 as \1", text)
    if count != 1:
        raise RuntimeError(f"expected one 'import splitspec_pb2' in {grpc_module}, found {count}")
    grpc_module.write_text(fixed)
    return [out_dir / name for name in GENERATED]


def drifted(target_dir: Path = PROTO_DIR, proto_dir: Path = PROTO_DIR) -> list[str]:
    """Names of generated files in ``target_dir`` that differ from a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp), proto_dir)
        return [
            name
            for name in GENERATED
            if not (target_dir / name).is_file()
            or (target_dir / name).read_bytes() != (Path(tmp) / name).read_bytes()
        ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m protos.generate", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the committed files are stale"
    )
    args = parser.parse_args(argv)
    if args.check:
        stale = drifted()
        if stale:
            print(
                f"stale generated files: {', '.join(stale)}; run `python -m protos.generate`",
                file=sys.stderr,
            )
            return 1
        print("generated files are up to date")
        return 0
    for path in generate(PROTO_DIR):
        print(f"wrote {path.relative_to(PROTO_DIR.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
