"""``splitspec bench products``: which product path keeps a row's bits at the smallest row tile?

Canonical shapes (``cloud.invariance.probe.invariant_row_padding``) pad every product's rows to a tile at
which the CPU's kernels give each row the same bits whatever its batch-mates. This probe checks
other ways to compute ``x @ W.T`` for that property and times them on Gemma 3 270M's shapes:
BLAS GEMM with either operand order (``linear``, ``matmul``, ``mm``, ``addmm``, ``x_wt``,
``w_xt``), oneDNN's inner product (``onednn``), and row-wise paths (``mv_rows``: one GEMV per
row; ``bmm_rows``: a batch of 1-row products), under MKL / oneDNN settings that must be in the
environment before torch loads (each setting runs in its own subprocess).

Invariance: ``REF_ROWS`` rows (48 for the row-wise paths) are computed in one product; then for
each count m (1..33 and some prefill sizes up to 100) a random sample of m of them, in random
order, and each row must equal (``torch.equal``) its reference, at each thread count asked.
A path's tile is the first (tile, multiple) of ``TILES`` under which every checked count that
padding can produce holds, for the head and every small weight; None when none does.

Contract. ``run_product_probe(...)`` returns the report dict (JSON-able; per setting: the
invariance per path, shape and thread count, the tile, and per-product times in ms at one
thread, candidates interleaved in random order, median / min / max over ``repeats``);
``probe_here(...)`` is the same for the current process's environment.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HEAD = (262144, 640)
SMALL = ((2048, 640), (640, 2048), (1024, 640), (640, 1024), (256, 640))  # (out, in) of Gemma 3 270M's layers
TILES = (1, 2, 4, 8, 16)
REF_ROWS = 128  # a multiple of every tile, more than any count checked (48 for the row-wise paths)
BIG = (47, 48, 64, 65, 100)  # prefill-sized products
SMALL_COUNTS = (*range(1, 34), *BIG)
HEAD_COUNTS = (*range(1, 18), 23, 24, 31, 32, 33, *BIG)  # the head is costly; enough for every tile's rule
ROWWISE, ROWWISE_COUNTS = ("mv_rows", "bmm_rows"), (1, 2, 3, 5, 8, 9, 16, 17, 33)  # a row costs a whole GEMV
TIMED_ROWS = (1, 2, 4, 8, 9, 16)
GEMM_PATHS = ("linear", "x_wt", "w_xt", "onednn")
ALL_PATHS = ("linear", "matmul", "mm", "addmm", "x_wt", "w_xt", "onednn", "mv_rows", "bmm_rows")
SETTINGS = (  # (name, environment, paths, invariance thread counts)
    ("default", {}, ALL_PATHS, (1, 2)),
    ("MKL_CBWR=AVX2", {"MKL_CBWR": "AVX2"}, GEMM_PATHS[:3], (1,)),
    ("MKL_CBWR=AVX2,STRICT", {"MKL_CBWR": "AVX2,STRICT"}, GEMM_PATHS[:3], (1, 2)),
    ("MKL_CBWR=AVX512,STRICT", {"MKL_CBWR": "AVX512,STRICT"}, GEMM_PATHS[:3], (1, 2)),
    ("MKL_CBWR=COMPATIBLE", {"MKL_CBWR": "COMPATIBLE"}, GEMM_PATHS[:3], (1,)),
    ("ONEDNN_MAX_CPU_ISA=AVX2", {"ONEDNN_MAX_CPU_ISA": "AVX2"}, ("linear", "onednn"), (1,)),
)

__all__ = ["run_product_probe", "probe_here", "pick_tile", "SETTINGS"]


def _path(name: str, weight):
    """``f(x) -> x @ weight.T`` computed the ``name`` way (operand copies made once, here)."""
    import torch
    import torch.nn.functional as F

    wt = weight.t().contiguous()
    zero = weight.new_zeros(weight.shape[0])
    packed = weight.to_mkldnn() if name == "onednn" else None

    def rows_mv(x):
        out = x.new_empty(x.shape[0], weight.shape[0])
        for i in range(x.shape[0]):
            torch.mv(weight, x[i], out=out[i])
        return out

    return {
        "linear": lambda x: F.linear(x, weight),
        "matmul": lambda x: torch.matmul(x, weight.t()),
        "mm": lambda x: torch.mm(x, weight.t()),
        "addmm": lambda x: torch.addmm(zero, x, weight.t()),
        "x_wt": lambda x: torch.mm(x, wt),
        "w_xt": lambda x: torch.mm(weight, x.t()).t(),
        "onednn": lambda x: torch._C._nn.mkldnn_linear(x.to_mkldnn(), packed).to_dense(),
        "mv_rows": rows_mv,
        "bmm_rows": lambda x: torch.bmm(x.unsqueeze(1), wt.expand(x.shape[0], *wt.shape)).squeeze(1),
    }[name]


def _holds(equal: dict[int, bool], tile: int, multiple: bool) -> bool:
    return all(ok for m, ok in equal.items() if (m % tile == 0 if multiple else m >= tile))


def pick_tile(checks: list[dict[int, bool]]) -> dict[str, Any] | None:
    """The first (tile, multiple) of ``TILES`` under which every check (count -> row bits equal) holds."""
    for tile in TILES:
        for multiple in (False, True):
            if all(_holds(equal, tile, multiple) for equal in checks):
                return {"tile": tile, "multiple": multiple}
    return None


def _ranges(counts: list[int]) -> str:
    """Counts as compact ranges: [1, 2, 3, 5] -> "1-3,5" ("" when none)."""
    spans: list[list[int]] = []
    for m in sorted(counts):
        if spans and m == spans[-1][1] + 1:
            spans[-1][1] = m
        else:
            spans.append([m, m])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _invariance(fn, x, counts, gen) -> dict[int, bool]:
    import torch

    ref = fn(x)
    out = {}
    for m in counts:
        idx = torch.randperm(x.shape[0], generator=gen)[:m]
        out[m] = torch.equal(fn(x[idx]), ref[idx])
    return out


def probe_here(paths=ALL_PATHS, threads=(1, 2), head=HEAD, small=SMALL, repeats: int = 5,
               seed: int = 0) -> dict[str, Any]:
    """Invariance and timings of ``paths`` in this process (MKL / oneDNN settings as the environment set them)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    weights = {shape: torch.randn(*shape, generator=gen) * 0.05 for shape in (head, *small)}
    x = {k: torch.randn(REF_ROWS, k, generator=gen) for k in {shape[1] for shape in weights}}
    fns = {(p, shape): _path(p, w) for p in paths for shape, w in weights.items()}
    report: dict[str, Any] = {"paths": {}}
    for p in paths:
        checks, rows = [], {}
        for n in threads:
            torch.set_num_threads(n)
            for shape in weights:
                counts = ROWWISE_COUNTS if p in ROWWISE else HEAD_COUNTS if shape == head else SMALL_COUNTS
                ref = x[shape[1]][: 48 if p in ROWWISE else REF_ROWS]
                equal = _invariance(fns[p, shape], ref, counts, gen)
                checks.append(equal)
                rows[f"{shape[0]}x{shape[1]}@{n}t"] = _ranges([m for m, ok in equal.items() if not ok])
        tile_1t = pick_tile(checks[: len(weights)])
        report["paths"][p] = {"tile": pick_tile(checks), "tile_at_1_thread": tile_1t, "counts_differing": rows}
    torch.set_num_threads(1)
    times: dict[tuple[str, int], list[float]] = {}
    order = [(p, r) for p in paths for r in TIMED_ROWS]
    rng = random.Random(seed)
    for _ in range(repeats):
        rng.shuffle(order)  # candidates interleaved, so a busy moment lands on any of them
        for p, r in order:
            xs = torch.randn(r, head[1], generator=gen)
            start = time.perf_counter()
            fns[p, head](xs)
            times.setdefault((p, r), []).append((time.perf_counter() - start) * 1e3)
    for p in paths:
        report["paths"][p]["head_ms"] = {
            r: {"median": round(statistics.median(t), 2), "min": round(min(t), 2), "max": round(max(t), 2)}
            for r in TIMED_ROWS for t in [times[p, r]]}
    return report


def run_product_probe(settings=SETTINGS, head=HEAD, small=SMALL, repeats: int = 5, seed: int = 0) -> dict[str, Any]:
    """Every setting probed in a subprocess of its own; the report dict (see the module docstring)."""
    import torch

    root = Path(__file__).resolve().parents[2]
    report: dict[str, Any] = {"torch": torch.__version__, "config": torch.__config__.show(), "settings": {}}
    for name, env, paths, threads in settings:
        args = json.dumps({"paths": list(paths), "threads": list(threads), "head": list(head),
                           "small": [list(s) for s in small], "repeats": repeats, "seed": seed})
        started = time.perf_counter()
        worker = "import sys; from sim.bench.products import _worker; _worker(sys.argv[1])"
        done = subprocess.run([sys.executable, "-c", worker, args], cwd=root,
                              env={**os.environ, "PYTHONPATH": str(root), **env}, capture_output=True, text=True)
        if done.returncode:
            report["settings"][name] = {"env": env, "error": done.stderr[-2000:]}
            continue
        result = json.loads(done.stdout.strip().splitlines()[-1])
        base = result["paths"]["linear"]["head_ms"] if "linear" in result["paths"] else None
        for info in result["paths"].values():
            tile = info["tile"]
            if tile and base:  # a lone row's head under this path's padding, against free F.linear here
                ms = info["head_ms"][str(tile["tile"])]["median"]
                info["one_row_canonical_ms"] = ms
                info["one_row_vs_free_linear"] = round(ms / base["1"]["median"], 2)
        report["settings"][name] = {"env": env, "seconds": round(time.perf_counter() - started, 1), **result}
    return report


def _worker(arguments: str) -> None:
    """A setting's subprocess: ``probe_here`` on ``arguments`` (JSON), its report as one JSON line."""
    kw = json.loads(arguments)
    kw["head"], kw["small"] = tuple(kw["head"]), tuple(tuple(s) for s in kw["small"])
    print(json.dumps(probe_here(**kw)))
