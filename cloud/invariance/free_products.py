"""Free shapes' product paths, measured on the machine they run on: per weight shape and row count, the
BLAS on ``x · Wᵀ`` (``F.linear``), the BLAS on the product transposed, ``(W · xᵀ)ᵀ``, oneDNN, or our own
kernel (``cloud.invariance.rowdot``) built for AVX2 or for AVX-512, where it builds and runs here.

Canonical shapes run every product on oneDNN where its tile holds (``cloud.invariance.products``: the
``torch.equal`` probe is their gate). Free shapes owe nothing to invariance, so each product may take
whichever path is faster *here*, and which one is depends on the CPU (AVX-512 or not), the BLAS and
oneDNN builds, the thread count and the product's own shape: on the Xeon of ``docs/batching.md`` MKL's
one-row kernel wins and oneDNN wins from two rows; on an AMD EPYC without AVX-512 Gemma's 262144 x 640
head ran fastest on oneDNN for a lone row (52 ms against 62 on ``F.linear``) and as ``(W · xᵀ)ᵀ`` at 2
and 4 rows (85 and 65 ms against 95 and 79 on oneDNN, 118 and 115 on ``F.linear``), while its small
layers took each path somewhere (``docs/results/2026-12-07-product-paths-epyc``); ``rowdot`` then beat
every one of them from two rows, the head's 9 rows by a fifth and the small layers' by half
(``docs/results/2026-12-07-rowdot-epyc``). On a Xeon with AVX-512 the head's 9 rows took 100 ms on oneDNN,
69 on rowdot's AVX2 build and 63 on its AVX-512 build, 16 rows 111 (``(W · xᵀ)ᵀ``), 108 and 85
(``docs/results/2026-12-07-rowdot512-xeon``).

At load, ``choose`` times every path on each distinct weight shape of the model at the probe row
counts, on the engine's threads, and keeps a path for a shape and row count only where it is faster
there: the prior rule (the BLAS for one row, oneDNN from two) stands unless another path is faster by
``MARGIN`` (the fastest such one then), so noise cannot flip a choice. The choice is cached per machine
(CPU model, cores, threads, torch and oneDNN versions, the shapes, the paths, the rowdot builds) under
``$SPLITSPEC_CACHE`` (default ``~/.cache/splitspec``), so a cloud measures once, and every process on
the machine agrees. ``FreeProducts.path(shape, rows)`` answers for any shape (the prior for one not
measured) and row count (the nearest probe at or below it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from cloud.invariance import rowdot
from shared.models import cache_dir

__all__ = ["BLAS", "BLAS_WX", "ONEDNN", "ROWDOT", "ROWDOT512", "ROWDOT_ISA", "PATHS", "FreeProducts", "PRIOR", "Shape",
           "choose", "run_path"]

log = logging.getLogger(__name__)

BLAS, ONEDNN, BLAS_WX, ROWDOT, ROWDOT512 = "blas", "onednn", "blas_wx", "rowdot", "rowdot512"
PATHS = (BLAS, ONEDNN, BLAS_WX, ROWDOT, ROWDOT512)
ROWDOT_ISA = {ROWDOT: rowdot.AVX2, ROWDOT512: rowdot.AVX512}  # the rowdot paths: the build each runs
PROBE_ROWS = (1, 2, 3, 4, 6, 9, 12, 16, 24, 32)
MARGIN = 1.10  # another path replaces the prior's only when faster by this factor
_REPEATS = 3
_NAMES = {BLAS: "x·Wᵀ", ONEDNN: "oneDNN", BLAS_WX: "(W·xᵀ)ᵀ", ROWDOT: "rowdot", ROWDOT512: "rowdot AVX-512"}

Shape = tuple[int, int]  # a weight's (in_features, out_features)


def prior_path(rows: int) -> str:
    """The rule before any measurement: the BLAS for a lone row, oneDNN from two."""
    return BLAS if rows < 2 else ONEDNN


@dataclass(frozen=True)
class FreeProducts:
    """Per weight shape, the path a free-shape product takes at each of ``PROBE_ROWS``; ``ms``: what was
    measured, per shape and probe row count the milliseconds of each of ``PATHS`` (empty: the prior
    rule, not measured)."""

    paths: dict[Shape, tuple[str, ...]] = field(default_factory=dict)
    ms: dict[Shape, dict[int, tuple[float, ...]]] = field(default_factory=dict)
    source: str = "prior"  # "prior", "measured", or "cached: <path>"

    def path(self, shape: Shape, rows: int) -> str:
        """The path of a free-shape product of ``rows`` rows on a weight of ``shape`` (the nearest probe
        at or below ``rows``; the prior rule for a shape not measured)."""
        index = max((i for i, p in enumerate(PROBE_ROWS) if p <= rows), default=0)
        chosen = self.paths.get(shape)
        return chosen[index] if chosen else prior_path(PROBE_ROWS[index])

    def describe(self) -> str:
        """One line: per shape, where each path runs (the costliest shapes first), and why."""
        if not self.paths:
            return "x·Wᵀ at 1 row, oneDNN from 2 (the prior rule, not measured here)"
        cost = {shape: sum(min(t) for t in by_rows.values()) for shape, by_rows in self.ms.items()}
        parts = []
        for shape in sorted(self.paths, key=lambda s: -cost.get(s, 0.0)):
            runs: list[tuple[str, list[int]]] = []
            for rows, path in zip(PROBE_ROWS, self.paths[shape]):
                if runs and runs[-1][0] == path:
                    runs[-1][1].append(rows)
                else:
                    runs.append((path, [rows]))
            where = ", ".join(f"{_NAMES[p]} at {_span(r)}" for p, r in runs)
            parts.append(f"{shape[0]}→{shape[1]}: {where}")
        return f"{'; '.join(parts)} ({self.source})"

    def to_json(self) -> dict:
        return {"paths": {_key(s): list(p) for s, p in self.paths.items()},
                "ms": {_key(s): {str(r): list(t) for r, t in by_rows.items()} for s, by_rows in self.ms.items()}}

    @classmethod
    def from_json(cls, data: dict, source: str) -> FreeProducts:
        paths = {_shape(k): tuple(str(p) for p in v) for k, v in data["paths"].items()}
        if any(len(p) != len(PROBE_ROWS) or not set(p) <= set(PATHS) for p in paths.values()):
            raise ValueError("a cached choice names other probe rows or paths")
        ms = {_shape(k): {int(r): tuple(float(x) for x in t) for r, t in v.items()} for k, v in data["ms"].items()}
        return cls(paths, ms, source)


PRIOR = FreeProducts()


def _key(shape: Shape) -> str:
    return f"{shape[0]}x{shape[1]}"


def _shape(key: str) -> Shape:
    inner, outer = key.split("x")
    return int(inner), int(outer)


def _span(rows: list[int]) -> str:
    return f"{rows[0]} row{'s' if rows[-1] > 1 else ''}" if len(rows) == 1 else f"{rows[0]}-{rows[-1]} rows"


def run_path(path: str, x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` ([rows, in] -> [rows, out], contiguous) on ``path`` (``packed``: the weight in
    oneDNN's layout; a rowdot path raises ValueError where it does not take the weight: ``rowdot.supports``)."""
    if path == BLAS:
        return torch.nn.functional.linear(x, weight)
    if path == BLAS_WX:
        return torch.mm(weight, x.t()).t().contiguous()
    if path in ROWDOT_ISA:
        return rowdot.rowdot(x, weight, ROWDOT_ISA[path])
    return torch._C._nn.mkldnn_linear(x.to_mkldnn(), packed).to_dense()


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


def _measure(linears: list[torch.nn.Module]) -> dict[Shape, dict[int, tuple[float, ...]]]:
    """Per distinct weight shape and probe row count, the milliseconds of each of ``PATHS`` (infinite
    for a path that does not take the weight here: ``rowdot.supports``)."""
    def runs(path: str, weight: torch.Tensor) -> bool:
        return path not in ROWDOT_ISA or rowdot.supports(weight, ROWDOT_ISA[path])

    first = {(m.in_features, m.out_features): m for m in reversed(linears)}
    out: dict[Shape, dict[int, tuple[float, ...]]] = {}
    with torch.inference_mode():
        for shape, module in first.items():
            out[shape] = {}
            for rows in PROBE_ROWS:
                x = torch.randn(rows, shape[0], dtype=module.weight.dtype)
                out[shape][rows] = tuple(
                    round(_median_ms(lambda p=path, x=x, m=module: run_path(p, x, m.weight, m.packed)), 3)
                    if runs(path, module.weight) else math.inf for path in PATHS)
    return out


def _choice(by_rows: dict[int, tuple[float, ...]]) -> tuple[str, ...]:
    """One shape's path at each probe row count: the prior's, unless another is ``MARGIN`` faster there
    (the fastest of those)."""
    chosen = []
    for rows in PROBE_ROWS:
        times = dict(zip(PATHS, by_rows[rows]))
        prior = prior_path(rows)
        fastest = min(PATHS, key=times.__getitem__)
        chosen.append(fastest if times[fastest] * MARGIN < times[prior] else prior)
    return tuple(chosen)


def choose(linears: list[torch.nn.Module], cache: Path | None = None) -> FreeProducts:
    """The free-shape paths for ``linears`` (``PackedLinear`` modules) on this machine: from the cache,
    else measured now and cached. None of them: the prior rule."""
    if not linears:
        return PRIOR
    machine = _machine()
    shapes = Counter((m.in_features, m.out_features) for m in linears)
    key = {**machine, "shapes": sorted(shapes.items()), "paths": list(PATHS),
           "rowdot": {isa: rowdot.build_id(isa) if rowdot.available(isa) else None  # (a new kernel is timed anew)
                      for isa in ROWDOT_ISA.values()}}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = (cache or cache_dir()) / f"free-products-{digest}.json"
    try:
        return FreeProducts.from_json(json.loads(path.read_text()), f"cached: {path}")
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        pass
    log.info("timing free shapes' products on this machine (%s, %d threads, %d weight shapes, %d paths): once, "
             "cached at %s", machine["cpu"], machine["threads"], len(shapes), len(PATHS), path)
    ms = _measure(linears)
    made = FreeProducts({shape: _choice(by_rows) for shape, by_rows in ms.items()}, ms, "measured")
    try:  # another process on this machine may have measured meanwhile: every process takes the first choice
        return FreeProducts.from_json(json.loads(path.read_text()), f"cached: {path}")
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        pass
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".partial-{os.getpid()}")
        partial.write_text(json.dumps({**made.to_json(), "machine": key}, indent=1))
        partial.replace(path)  # (atomic: a process reading it sees all or nothing)
    except OSError as exc:
        log.warning("could not cache the products' timings at %s: %s", path, exc)
    return made
