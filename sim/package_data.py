"""Data files shipped inside the package (scenarios, hardware profiles), or a user's own file.

A bare name (``acespec-50k``) means a shipped file ``sim/<folder>/<name>.toml``;
anything with a path separator or a ``.toml`` suffix is a path.
"""

from __future__ import annotations

import importlib.resources
import tomllib
from pathlib import Path
from typing import Any

__all__ = ["list_shipped", "load_toml"]


def _folder(folder: str) -> Any:
    """``folder`` is a /-separated path under the ``sim`` package."""
    try:
        return importlib.resources.files("sim").joinpath(*folder.split("/"))
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - unusual installs
        return Path(__file__).resolve().parent / folder


def list_shipped(folder: str) -> list[str]:
    """Names of the shipped ``.toml`` files in ``sim/<folder>``, sorted."""
    return sorted(p.name[: -len(".toml")] for p in _folder(folder).iterdir() if p.name.endswith(".toml"))


def load_toml(name_or_path: str | Path, folder: str, what: str) -> tuple[dict[str, Any], str, str]:
    """Parse a shipped or user TOML file: (data, source for messages, default name).

    ValueError names the shipped choices for an unknown name, and the file for
    a missing file or invalid TOML.
    """
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or "/" in text or "\\" in text or text.endswith(".toml"):
        path = Path(text)
        if not path.is_file():
            raise ValueError(f"{what} file not found: {path}")
        source, raw, default_name = str(path), path.read_bytes(), path.stem
    else:
        resource = _folder(folder) / f"{text}.toml"
        if not resource.is_file():
            raise ValueError(
                f"unknown {what} {text!r}; shipped: {', '.join(list_shipped(folder))} (or pass a path to a .toml file)"
            )
        source, raw, default_name = f"{what} {text!r}", resource.read_bytes(), text
    try:
        return tomllib.loads(raw.decode("utf-8")), source, default_name
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{source}: invalid TOML: {e}") from e
