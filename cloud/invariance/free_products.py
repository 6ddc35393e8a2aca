"""Free shapes' product path, measured on the machine it runs on: the BLAS (``F.linear``) or oneDNN, by rows.

Canonical shapes run every product on oneDNN where its tile holds (``cloud.invariance.products``: the
``torch.equal`` probe is their gate). Free shapes owe nothing to invariance, so each product may take
whichever path is faster *here*: which one is depends on the CPU (AVX-512 or not), the BLAS and oneDNN
builds and the thread count. On the Xeon of ``docs/batching.md`` MKL's one-row kernel wins and oneDNN
wins from two rows; on another machine the crossing may sit elsewhere, or nowhere.

At load, ``choose`` times both paths on the model's own linear shapes (each distinct weight shape,
counted as often as the model has it) at the probe row counts, on the engine's threads, and keeps a
path at a row count only where it is faster there; the prior rule (the BLAS for one row, oneDNN from
two) stands unless the other path is faster by ``MARGIN``, so noise cannot flip a choice. The choice is
cached per machine (CPU model, cores, threads, torch and oneDNN versions, the shapes) under
``$SPLITSPEC_CACHE`` (default ``~/.cache/splitspec``), so a cloud measures once, and every process on
the machine agrees. ``FreeProducts.onednn(rows)`` answers for any row count (the nearest probe at or
below it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

__all__ = ["FreeProducts", "PRIOR", "cache_dir", "choose"]

log = logging.getLogger(__name__)

PROBE_ROWS = (1, 2, 3, 4, 6, 9, 12, 16, 24, 32)
MARGIN = 1.10  # the other path replaces the prior's only when faster by this factor
_REPEATS = 3


@dataclass(frozen=True)
class FreeProducts:
    """Per probe row count, whether free shapes' products run on oneDNN; ``ms``: what was measured
    there, (BLAS, oneDNN) per forward's products (empty: the prior rule, not measured)."""

    onednn_rows: tuple[int, ...]  # the probe row counts that take oneDNN
    ms: dict[int, tuple[float, float]] = field(default_factory=dict)
    source: str = "prior"  # "prior", "measured", or "cached: <path>"

    def onednn(self, rows: int) -> bool:
        """Whether a free-shape product of ``rows`` rows runs on oneDNN (the nearest probe at or below)."""
        probe = max((p for p in PROBE_ROWS if p <= rows), default=PROBE_ROWS[0])
        return probe in self.onednn_rows

    def describe(self) -> str:
        """One line: where each path runs, and why."""
        blas = [r for r in PROBE_ROWS if r not in self.onednn_rows]
        where = f"oneDNN at {_rows(self.onednn_rows)} rows, the BLAS at {_rows(blas)}"
        if not self.ms:
            return f"{where} (the prior rule, not measured here)"
        times = ", ".join(f"{r}: {b:.1f}/{o:.1f}" for r, (b, o) in sorted(self.ms.items()))
        return f"{where} ({self.source}; ms BLAS/oneDNN by rows {times})"

    def to_json(self) -> dict:
        return {"onednn_rows": list(self.onednn_rows), "ms": {str(r): list(t) for r, t in self.ms.items()}}

    @classmethod
    def from_json(cls, data: dict, source: str) -> FreeProducts:
        return cls(tuple(int(r) for r in data["onednn_rows"]),
                   {int(r): (float(t[0]), float(t[1])) for r, t in data["ms"].items()}, source)


PRIOR = FreeProducts(tuple(r for r in PROBE_ROWS if r > 1))


def _rows(rows) -> str:
    return ", ".join(map(str, rows)) or "none"


def cache_dir() -> Path:
    return Path(os.environ.get("SPLITSPEC_CACHE") or Path.home() / ".cache" / "splitspec")


def _machine() -> dict:
    """What a measurement holds for: the CPU, the cores and threads, the torch and oneDNN builds."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    onednn = next((line.strip() for line in torch.__config__.show().splitlines() if "MKL-DNN" in line or "oneDNN" in line),
                  "none")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu, "cores": cores, "threads": torch.get_num_threads(), "torch": torch.__version__, "onednn": onednn}


def _median_ms(run) -> float:
    run()  # warm-up: the first call pays for kernels' set-up
    times = []
    for _ in range(_REPEATS):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times)


def _measure(linears: list[torch.nn.Module]) -> dict[int, tuple[float, float]]:
    """Per probe row count, (BLAS ms, oneDNN ms) over the model's linear products, each distinct shape
    timed once and counted as often as the model has it."""
    shapes = Counter((m.in_features, m.out_features) for m in linears)
    first = {(m.in_features, m.out_features): m for m in reversed(linears)}
    out = {}
    with torch.inference_mode():
        for rows in PROBE_ROWS:
            blas = onednn = 0.0
            for shape, count in shapes.items():
                module = first[shape]
                x = torch.randn(rows, shape[0], dtype=module.weight.dtype)
                blas += count * _median_ms(lambda m=module, x=x: torch.nn.functional.linear(x, m.weight))
                onednn += count * _median_ms(lambda m=module, x=x: torch._C._nn.mkldnn_linear(x.to_mkldnn(), m.packed))
            out[rows] = (round(blas, 2), round(onednn, 2))
    return out


def _choice(ms: dict[int, tuple[float, float]]) -> tuple[int, ...]:
    """The rows that take oneDNN: the prior's choice, unless the other path is ``MARGIN`` faster there."""
    chosen = []
    for rows, (blas, onednn) in sorted(ms.items()):
        prior = PRIOR.onednn(rows)
        if (prior and not blas * MARGIN < onednn) or (not prior and onednn * MARGIN < blas):
            chosen.append(rows)
    return tuple(chosen)


def choose(linears: list[torch.nn.Module], cache: Path | None = None) -> FreeProducts:
    """The free-shape paths for ``linears`` (``PackedLinear`` modules) on this machine: from the cache,
    else measured now and cached. None of them: the prior rule."""
    if not linears:
        return PRIOR
    machine = _machine()
    key = {**machine, "shapes": sorted(Counter((m.in_features, m.out_features) for m in linears).items())}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = (cache or cache_dir()) / f"free-products-{digest}.json"
    try:
        return FreeProducts.from_json(json.loads(path.read_text()), f"cached: {path}")
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        pass
    log.info("timing free shapes' products on this machine (%s, %d threads): once, cached at %s",
             machine["cpu"], machine["threads"], path)
    ms = _measure(linears)
    made = FreeProducts(_choice(ms), ms, "measured")
    try:  # another process on this machine may have measured meanwhile: every process takes the first choice
        return FreeProducts.from_json(json.loads(path.read_text()), f"cached: {path}")
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        pass
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".partial-{os.getpid()}")
        partial.write_text(json.dumps({**made.to_json(), "machine": key}, indent=1))
        partial.replace(path)  # (atomic: a process reading it sees all or nothing)
    except OSError as exc:
        log.warning("could not cache the products' timings at %s: %s", path, exc)
    return made
