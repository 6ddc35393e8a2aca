"""Resolving the target model: a Hugging Face folder as is (its safetensors
files checked whole first), a GGUF file via a cached float32 conversion
(transformers dequantizes GGUF slowly; the saved folder reloads in seconds), or
the default Gemma model when none is given. The cache is keyed by the GGUF's
content (SHA-256), and staging folders that a conversion which died left
behind are removed before the next one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

from shared.cli import CliError
from shared.models import cache_dir, default_gguf_path

__all__ = ["resolve_target", "check_checkpoint", "content_key"]

log = logging.getLogger(__name__)


def resolve_target(path: str | Path | None) -> Path:
    """A loadable Hugging Face folder for ``path`` (None = default Gemma target)."""
    source = default_gguf_path() if path is None else Path(path)
    if not source.exists():
        raise FileNotFoundError(f"target model not found: {source}")
    if source.is_dir():
        check_checkpoint(source)
        return source
    if source.suffix != ".gguf":
        raise ValueError(f"target must be a Hugging Face folder or a .gguf file, got {source}")
    return _converted(source)


def check_checkpoint(folder: Path) -> None:
    """Refuse, in one line (``CliError``, exit 1), a folder whose safetensors files are cut short or are
    not safetensors (a copy or a download that stopped), before transformers spends a load on them and
    raises its own traceback. Reads each file's header, never its tensors."""
    for file in sorted(folder.glob("*.safetensors")):
        size = file.stat().st_size
        with file.open("rb") as stream:
            length = int.from_bytes(stream.read(8), "little") if size >= 8 else 0
            try:
                header = json.loads(stream.read(length)) if 2 <= length <= size - 8 else None
            except ValueError:  # not JSON (UnicodeDecodeError included)
                header = None
        if not isinstance(header, dict):
            raise CliError(f"cannot load the target model from {folder}: {file.name} is not a safetensors file "
                           f"(no readable header in its {size} bytes)")
        end = max((entry["data_offsets"][1] for name, entry in header.items()
                   if name != "__metadata__" and isinstance(entry, dict) and len(entry.get("data_offsets", ())) == 2),
                  default=0)
        if 8 + length + end > size:
            raise CliError(f"cannot load the target model from {folder}: {file.name} is truncated ({size} bytes; "
                           f"its header describes {8 + length + end})")


def content_key(path: Path, chunk: int = 1 << 20) -> str:
    """The first 16 hex digits of ``path``'s SHA-256: a file replaced in place (same size, same mtime)
    gets a new key, a copy elsewhere shares the old one."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while block := stream.read(chunk):
            digest.update(block)
    return digest.hexdigest()[:16]


def _remove_abandoned(folder: Path) -> None:
    """Staging folders of ``folder`` left by conversions that died (their process is gone)."""
    for staging in folder.parent.glob(f"{folder.name}.partial-*"):
        pid = staging.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or not _alive(int(pid)):
            log.info("removing %s, left by a conversion that did not finish", staging)
            shutil.rmtree(staging, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's: alive
        return True
    return True


def _converted(gguf: Path) -> Path:
    folder = cache_dir() / "targets" / f"{gguf.stem}-{content_key(gguf)}"
    if (folder / "config.json").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(folder)
    print(
        f"splitspec: converting {gguf.name} to a float32 folder for the target (once; about a minute) ...",
        file=sys.stderr,
        flush=True,
    )
    started = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # save_pretrained refuses a model still marked as GGUF-quantized.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # A staging folder per process: two processes converting at once (parallel tests, a
    # cloud and a benchmark) must not write into one folder; the first rename wins.
    staging = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    try:
        staging.rename(folder)
    except OSError:
        if not (folder / "config.json").exists():
            raise
        shutil.rmtree(staging, ignore_errors=True)  # another process finished first
    print(f"splitspec: target cached at {folder} ({time.perf_counter() - started:.0f}s)", file=sys.stderr, flush=True)
    return folder
