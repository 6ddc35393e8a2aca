"""A free-shape product path of our own: ``rowdot.c``, compiled here at first use and loaded with ctypes.

The BLAS and oneDNN run the skinny products of decoding (1 to 32 rows against a weight of thousands)
far below what the core allows: on an AMD EPYC without AVX-512, one thread, Gemma 3's 262144 x 640
head took 96 ms on oneDNN for 9 rows where ``rowdot`` takes 75, and its 640-wide layers half the time
(``docs/results/2026-12-07-rowdot-epyc``). ``rowdot`` is built for each instruction set in ``ISAS`` that
this CPU has: ``avx2`` (AVX2 and FMA) and ``avx512`` (AVX-512F: twice the lanes and registers, so six
rows of x a block where AVX2 holds three). Each build is one more path that ``free_products`` measures
at load and takes only where it is faster on the machine. Each is row-invariant by construction (every
output's sum runs in one order whatever the rows beside it), single-threaded, float32 only; the two
builds sum in different orders, so their results differ in the last bits.

``available(isa)`` says whether a build runs here: x86-64 whose CPU flags name the instruction set, and a
C compiler (``$CC``, else ``cc``) to build it once into the cache directory (``shared.models.cache_dir``),
keyed by the source and the flags. A new build is run once in a child process before it is kept, so a CPU
that names an instruction set its system has not enabled (as VMs do with AMX) costs a log line, not the
process; anything else (another CPU, no compiler, a failed build or probe) leaves it out, logged once.
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
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from shared.models import cache_dir

__all__ = ["AVX2", "AVX512", "ISAS", "available", "build_id", "rowdot", "supports"]

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("rowdot.c")


@dataclass(frozen=True)
class Isa:
    """One build of the kernel: the CPU flags it needs, the compiler's flags, the floats a vector holds
    (a weight's width must be a multiple)."""

    cpu_flags: frozenset[str]
    flags: tuple[str, ...]
    lanes: int


AVX2, AVX512 = "avx2", "avx512"
ISAS = {
    AVX2: Isa(frozenset({"avx2", "fma"}), ("-O3", "-mavx2", "-mfma", "-shared", "-fPIC"), 8),
    AVX512: Isa(frozenset({"avx2", "fma", "avx512f"}), ("-O3", "-mavx2", "-mfma", "-mavx512f", "-shared", "-fPIC"), 16),
}

# A child process calls a fresh build once, on two rows of 16 (every build's lanes divide 16): a CPU flag
# the system has not enabled kills the child with SIGILL, not the cloud.
_PROBE = """import ctypes, sys
library = ctypes.CDLL(sys.argv[1])
floats = ctypes.c_float * 32
x, w, out = floats(*([1.0] * 32)), floats(*([0.5] * 32)), floats()
library.rowdot(x, w, out, ctypes.c_long(2), ctypes.c_long(2), ctypes.c_long(16))
sys.exit(0 if list(out[:4]) == [8.0] * 4 else 1)
"""


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _build(isa: str, compiler: str, built: Path) -> None:
    """Compile ``isa``'s build into ``built`` and run it once in a child (OSError, SubprocessError: it failed)."""
    with tempfile.TemporaryDirectory(dir=built.parent) as tmp:
        partial = Path(tmp) / built.name
        subprocess.run([compiler, *ISAS[isa].flags, "-o", str(partial), str(SOURCE)], check=True,
                       capture_output=True, text=True, timeout=120)
        subprocess.run([sys.executable, "-c", _PROBE, str(partial)], check=True, capture_output=True, text=True,
                       timeout=60)
        partial.replace(built)  # (atomic: another process building it meanwhile loses nothing)


@functools.cache
def _library(isa: str) -> ctypes.CDLL | None:
    """``isa``'s build of the kernel, built on first use (None where it cannot run here: the reason logged)."""
    needs = ISAS[isa].cpu_flags
    if platform.machine() not in ("x86_64", "AMD64") or not needs <= _cpu_flags():
        log.info("rowdot %s: not offered (needs x86-64 with %s; this is %s)", isa, ", ".join(sorted(needs)),
                 platform.machine())
        return None
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        log.info("rowdot %s: not offered (no C compiler: set $CC or install one)", isa)
        return None
    try:
        built = cache_dir() / f"rowdot-{isa}-{build_id(isa)}.so"
    except OSError as exc:
        log.warning("rowdot %s: not offered: no cache directory to build into: %s", isa, exc)
        return None
    if not built.exists():
        try:
            _build(isa, compiler, built)
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", "") or exc
            log.warning("rowdot %s: not offered: building or probing %s failed: %s", isa, SOURCE,
                        str(detail).strip()[-500:] or exc)
            return None
    try:
        library = ctypes.CDLL(str(built))
    except OSError as exc:
        log.warning("rowdot %s: not offered: loading %s failed: %s", isa, built, exc)
        return None
    library.rowdot.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long] * 3
    library.rowdot.restype = None
    return library


def build_id(isa: str = AVX2) -> str:
    """The kernel's source and ``isa``'s flags, digested: what its build, and any timing of it, is keyed by."""
    return hashlib.sha256(SOURCE.read_bytes() + " ".join(ISAS[isa].flags).encode()).hexdigest()[:16]


def available(isa: str = AVX2) -> bool:
    """Whether ``isa``'s build of ``rowdot`` runs on this machine (built here at the first call)."""
    return _library(isa) is not None


def supports(weight: torch.Tensor, isa: str = AVX2) -> bool:
    """Whether ``isa``'s ``rowdot`` takes products against ``weight`` ([out, in]): float32 on the CPU, ``in``
    a multiple of the build's lanes (8 for AVX2, 16 for AVX-512), and the build available here."""
    return (weight.dtype == torch.float32 and weight.device.type == "cpu" and weight.dim() == 2
            and weight.shape[1] % ISAS[isa].lanes == 0 and available(isa))


def rowdot(x: torch.Tensor, weight: torch.Tensor, isa: str = AVX2) -> torch.Tensor:
    """``x @ weight.T`` on ``isa``'s build: x [rows, in], weight [out, in] -> [rows, out], contiguous float32.
    ValueError where ``supports(weight, isa)`` is false or x does not match it."""
    if not supports(weight, isa):
        raise ValueError(f"rowdot {isa} takes float32 CPU weights of a width divisible by {ISAS[isa].lanes} on "
                         f"x86-64 with {', '.join(sorted(ISAS[isa].cpu_flags))}; got {tuple(weight.shape)} "
                         f"{weight.dtype} on {weight.device}" + ("" if available(isa) else " (not available here)"))
    if x.dim() != 2 or x.shape[1] != weight.shape[1] or x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"rowdot: x must be float32 [rows, {weight.shape[1]}] on the CPU, got "
                         f"{tuple(x.shape)} {x.dtype} on {x.device}")
    x, weight = x.contiguous(), weight.contiguous()
    out = torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32)
    if x.shape[0]:
        _library(isa).rowdot(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.shape[0], weight.shape[0],
                             weight.shape[1])
    return out
