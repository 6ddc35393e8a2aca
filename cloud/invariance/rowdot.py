"""A free-shape product path of our own: ``rowdot.c``, compiled here at first use and loaded with ctypes.

The BLAS and oneDNN run the skinny products of decoding (1 to 32 rows against a weight of thousands)
far below what the core allows: on an AMD EPYC without AVX-512, one thread, Gemma 3's 262144 x 640
head took 96 ms on oneDNN for 9 rows where ``rowdot`` takes 75, and its 640-wide layers half the time
(``docs/results/2026-12-07-rowdot-epyc``). ``rowdot`` is one more path that ``free_products`` measures
at load and takes only where it is faster on the machine; it is row-invariant by construction (each
output's sum runs in one order whatever the rows beside it), single-threaded, float32 only.

``available()`` says whether it runs here: x86-64 with AVX2 and FMA, and a C compiler (``$CC``, else
``cc``) to build it once into the cache directory (``shared.models.cache_dir``), keyed by the source
and the flags; anything else (another CPU, no compiler, a failed build) leaves it out, logged once.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from shared.models import cache_dir

__all__ = ["available", "build_id", "rowdot", "supports"]

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("rowdot.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-shared", "-fPIC")
LANES = 8  # floats a step of the kernel's inner loop reads: h must be a multiple


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use (None where it cannot run here: the reason logged)."""
    if platform.machine() not in ("x86_64", "AMD64") or not {"avx2", "fma"} <= _cpu_flags():
        log.info("rowdot: not offered (needs x86-64 with AVX2 and FMA; this is %s)", platform.machine())
        return None
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        log.info("rowdot: not offered (no C compiler: set $CC or install one)")
        return None
    try:
        built = cache_dir() / f"rowdot-{build_id()}.so"
    except OSError as exc:
        log.warning("rowdot: not offered: no cache directory to build into: %s", exc)
        return None
    if not built.exists():
        try:
            with tempfile.TemporaryDirectory(dir=built.parent) as tmp:
                partial = Path(tmp) / built.name
                subprocess.run([compiler, *FLAGS, "-o", str(partial), str(SOURCE)], check=True, capture_output=True,
                               text=True, timeout=120)
                partial.replace(built)  # (atomic: another process building it meanwhile loses nothing)
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", "") or exc
            log.warning("rowdot: not offered: building %s failed: %s", SOURCE, str(detail).strip()[-500:])
            return None
    try:
        library = ctypes.CDLL(str(built))
    except OSError as exc:
        log.warning("rowdot: not offered: loading %s failed: %s", built, exc)
        return None
    library.rowdot.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long] * 3
    library.rowdot.restype = None
    return library


def build_id() -> str:
    """The kernel's source and flags, digested: what its build, and any timing of it, is keyed by."""
    return hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()).hexdigest()[:16]


def available() -> bool:
    """Whether ``rowdot`` runs on this machine (built here at the first call)."""
    return _library() is not None


def supports(weight: torch.Tensor) -> bool:
    """Whether ``rowdot`` takes products against ``weight`` ([out, in]): float32 on the CPU, ``in`` a
    multiple of 8, and the kernel available here."""
    return (weight.dtype == torch.float32 and weight.device.type == "cpu" and weight.dim() == 2
            and weight.shape[1] % LANES == 0 and available())


def rowdot(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T``: x [rows, in], weight [out, in] -> [rows, out], contiguous float32. ValueError where
    ``supports(weight)`` is false or x does not match it."""
    if not supports(weight):
        raise ValueError(f"rowdot takes float32 CPU weights of a width divisible by {LANES} on x86-64 with AVX2 "
                         f"and FMA; got {tuple(weight.shape)} {weight.dtype} on {weight.device}"
                         + ("" if available() else " (not available here)"))
    if x.dim() != 2 or x.shape[1] != weight.shape[1] or x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"rowdot: x must be float32 [rows, {weight.shape[1]}] on the CPU, got "
                         f"{tuple(x.shape)} {x.dtype} on {x.device}")
    x, weight = x.contiguous(), weight.contiguous()
    out = torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32)
    if x.shape[0]:
        _library().rowdot(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], weight.shape[0],
                          weight.shape[1])
    return out
