"""The GPU check: the verifier on one accelerator, measured in one command that fits a short lease.

``scripts/gpu_check.sh`` runs it on the GPU machine (``splitspec bench gpu-check --out DIR``);
the test suite runs its CPU dry run (``--dry-run``: the same code at tiny shapes, in seconds), so it
cannot rot. Nothing is downloaded: the big targets are random weights of real models' shapes made on
the device (``sim.bench.gpu_models``), served by the product's own engine.

Sections, in order, each timed and kept to its share of ``--budget-s`` (a section past its share is
cut short where it can be, and every one that fails is reported with its error while the rest go on;
``DIR/gpu_check.json`` is rewritten after each, so a run killed at its limit still leaves what it did):

1. ``machine``: the device, torch and CUDA, and the two ceilings: a device-to-device copy's bandwidth
   and a big bf16 matrix product's rate.
2. ``products``: which row paddings make each of the 8B shape's products row-invariant on this
   device (``torch.equal``; the linear layers and canonical attention's), and the padding the engine
   chose (``cloud.invariance.probe``).
3. ``rows_8b``: one forward's time by rows (1..128) for one session, in free and canonical shapes;
   N sessions batched (N = 1, 8, 32; a decode row and a block of 8 each), free and canonical; the
   ridge; the 8B forward extrapolated from its own 4- and 8-layer slices against its measured whole
   (how far the 70B extrapolation can be trusted).
4. ``identity_8b``: a row's logits alone (one token a forward) against the same rows in blocks,
   chunks and crops beside batch-mates (``sim.bench.invariance``), bit for bit, in canonical and in
   free shapes.
5. ``rows_70b``: the 70B shape's first layers (1, 2, 4): a forward by rows, its cost per layer by a
   least-squares line over the layer counts, extrapolated to 80 layers on one GPU (which 70B's
   bf16 weights, 141 GB, would not fit: the figure is the per-layer cost times 80 plus the head's).
6. ``service``: the verifier service on the device with the tiny models over loopback gRPC: greedy
   and coupled sessions at once, split (prompt-lookup drafts) and cloud-only, each against
   target-only decoding (each session alone, cloud-only, one token a forward).

Contract. ``run_gpu_check(GpuCheck(...))`` returns the report dict and writes it; ``main`` is the
command line. The profiles made from a report are ``sim.bench.gpu_profiles``'.
"""

from __future__ import annotations

import contextlib
import json
import platform
import time
import traceback
from typing import Any

import torch

from sim.bench.gpu_models import (
    build_engine,
    device_sync,
    forward_ms,
    layers_in_use,
    new_sessions,
    release_memory,
)
from sim.bench.gpu_plan import SHARE, Deadline, GpuCheck
from sim.bench.gpu_service import service, service_8b

__all__ = ["run_gpu_check", "fit_line", "ridge", "summary", "exit_status"]

ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)  # one session's forward, by rows appended (to find the ridge)
BATCHED = (1, 8, 32)  # sessions in one forward
BATCHED_ROWS = (1, 8)  # each session's rows in it: a decode step, a block of drafts
CONTEXT = 512  # tokens each session holds before the timed forwards
FIXED_ROWS = (64, 128, 256)  # a fixed forward shape's rows, checked for invariance (``_fixed_shape_holds``)
ALIKE = 1.25  # rows "cost alike" to one while a forward costs at most this much more (a GPU's host-bound noise: 10-20%)
SLICE_LAYERS = (1, 2, 4)  # the 70B slice's layer counts


def machine(check: GpuCheck, deadline: Deadline) -> dict[str, Any]:
    """The device and its two ceilings, measured here."""
    device = torch.device(check.device)
    sync = device_sync(device)
    out: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(), "host": platform.node()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out.update(device=props.name, memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda,
                   multiprocessors=props.multi_processor_count)
    else:
        out["device"] = platform.processor() or platform.machine()
    size = (1 << 28) if not check.dry_run else (1 << 20)  # bytes copied
    a = torch.randn(size // 2, device=device, dtype=torch.bfloat16)
    b = torch.empty_like(a)
    n = 4096 if not check.dry_run else 128
    x, y = (torch.randn(n, n, device=device, dtype=check.torch_dtype) for _ in range(2))

    def best_s(run, times: int = 10) -> float:
        run()
        sync()
        samples = []
        for _ in range(times):
            started = time.perf_counter()
            run()
            sync()
            samples.append(time.perf_counter() - started)
        return sorted(samples)[len(samples) // 2]

    out["copy_gb_per_s"] = round(2 * size / best_s(lambda: b.copy_(a)) / 1e9, 1)  # bytes read and written
    out["matmul_tflop_per_s"] = round(2 * n**3 / best_s(lambda: x @ y) / 1e12, 1)
    out["matmul_size"] = n
    if device.type == "cuda":  # the settings a product's bits depend on
        matmul = torch.backends.cuda.matmul
        out["cuda_matmul"] = {"allow_tf32": matmul.allow_tf32,
                              "allow_bf16_reduced_precision_reduction": matmul.allow_bf16_reduced_precision_reduction,
                              "cudnn": torch.backends.cudnn.version()}
    return out


def products(check: GpuCheck, deadline: Deadline) -> dict[str, Any]:
    """Which paddings hold for the 8B shape's products (one layer and the head: the other layers repeat it)."""
    from cloud.invariance.probe import (
        attention_products,
        fixed_shape_holds,
        holding_paddings,
        linear_products,
        row_tiles_for,
    )

    big, _ = check.shapes
    engine = build_engine(big, device=check.device, dtype=check.torch_dtype, shapes="free", layers=1)
    tiles = row_tiles_for(engine.device)
    out: dict[str, Any] = {"tiles_tried": list(tiles)}
    for kind, listed in (("linear", linear_products(engine.model)), ("attention", attention_products(engine.model))):
        each = {f"{kind} {i}: {product.columns} columns against {tuple(product.like.shape)}":
                [repr(p) for p in holding_paddings([product], tiles)] for i, product in enumerate(listed)}
        out[kind] = {"each": each, "all": [repr(p) for p in holding_paddings(listed, tiles)],
                     "fixed_rows": {rows: fixed_shape_holds(listed, rows) for rows in FIXED_ROWS}}
    del engine
    release_memory(check.device)
    return out


@contextlib.contextmanager
def _padded_to(engine, padding):
    """The engine's canonical shapes padded as ``padding`` says (products and attention alike)."""
    before = engine.padding, engine.attention_padding
    engine.padding = engine.attention_padding = padding
    try:
        yield
    finally:
        engine.padding, engine.attention_padding = before


def ridge(curve: dict) -> int:
    """The most rows whose forward costs at most ``ALIKE`` times the cheapest one measured (the cheapest,
    not the first: a GPU's first timings can still be warming up)."""
    medians = {int(rows): ms["median"] for rows, ms in curve.items()}
    return max(rows for rows, ms in medians.items() if ms <= ALIKE * min(medians.values()))


@contextlib.contextmanager
def _every_forward_canonical(engine):
    """Every forward in the engine's canonical shapes (its padding), as ``--shapes canonical`` runs them,
    whether or not its probe found the padding invariant (the identity check then says how far off)."""
    before = engine.shapes
    engine.shapes = "canonical"
    try:
        yield
    finally:
        engine.shapes = before


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares ``y = fixed + slope * x`` over (x, y) ``points`` (an x may repeat): (fixed, slope);
    slope 0 where every point has the same x."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / (sum((x - mx) ** 2 for x in xs) or 1.0)
    return my - slope * mx, slope


def _by_layers(check: GpuCheck, engine, layer_counts, rows_list, repeats) -> dict[str, Any]:
    """One session's free forward by rows, on the model's first ``layer_counts`` layers; per rows, the
    line over layers (fixed and per-layer ms)."""
    measured: dict[int, dict[int, float]] = {}
    for layers in layer_counts:
        with layers_in_use(engine, layers):
            seqs = new_sessions(engine, 1, CONTEXT, seed=layers)
            measured[layers] = {rows: forward_ms(engine, seqs, rows, reproducible=False, repeats=repeats)["median"]
                                for rows in rows_list}
            del seqs
    lines = {rows: fit_line([(layers, measured[layers][rows]) for layers in layer_counts]) for rows in rows_list}
    return {"ms_by_layers": measured,
            "fixed_ms": {rows: round(line[0], 3) for rows, line in lines.items()},
            "per_layer_ms": {rows: round(line[1], 4) for rows, line in lines.items()}}


def rows_8b(check: GpuCheck, deadline: Deadline) -> dict[str, Any]:
    """The 8B shape's forward by rows and by sessions, free and canonical; the ridge; the layer extrapolation's error."""
    big, _ = check.shapes
    engine = build_engine(big, device=check.device, dtype=check.torch_dtype, shapes="auto")
    out: dict[str, Any] = {"model": engine.model_name, "params_b": round(big.params / 1e9, 3),
                           "padding": repr(engine.padding), "attention_padding": repr(engine.attention_padding),
                           "row_invariant_products": engine.invariant, "build_s": round(engine.load_s, 1)}
    fresh = engine.new_sequence()
    out["prefill_ms"] = {CONTEXT: forward_ms(engine, [fresh], CONTEXT, reproducible=False, repeats=3, logits="last")}
    seqs = new_sessions(engine, 1, CONTEXT)
    for name, reproducible in (("free", False), ("canonical", True)):
        curve: dict[int, dict] = {}
        for rows in ROWS:
            if deadline.passed:
                out["cut_short"] = True
                break
            if reproducible and engine.max_forward_rows is not None and rows > engine.max_forward_rows:
                continue  # past a fixed canonical shape: the scheduler splits such work across forwards
            curve[rows] = forward_ms(engine, seqs, rows, reproducible=reproducible, repeats=check.repeats)
        out[f"one_session_{name}"] = curve
        if curve:
            out[f"ridge_rows_{name}"] = ridge(curve)
    batched: dict[str, Any] = {}
    for sessions in BATCHED:
        if deadline.passed:
            out["cut_short"] = True
            break
        group = new_sessions(engine, sessions, CONTEXT, seed=sessions)
        for rows in BATCHED_ROWS:
            times = {name: forward_ms(engine, group, rows, reproducible=name == "canonical", repeats=check.repeats)
                     for name in ("free", "canonical")}
            times["canonical_over_free"] = round(times["canonical"]["median"] / times["free"]["median"], 3)
            batched[f"{sessions} sessions x {rows} rows"] = times
        del group
    out["batched"] = batched
    if not deadline.passed:  # how well a few layers predict the whole: the 70B figure's method, checked here
        layers = tuple(n for n in (1, 2, 4) if n < big.layers)
        fit = _by_layers(check, engine, layers, (1, 8), check.repeats)
        predicted = {rows: fit["fixed_ms"][rows] + big.layers * fit["per_layer_ms"][rows] for rows in (1, 8)}
        whole = {1: out["one_session_free"].get(1, {}).get("median"), 8: out["one_session_free"].get(8, {}).get("median")}
        out["layer_extrapolation"] = {**fit, "layers": big.layers, "predicted_ms": predicted, "measured_ms": whole,
                                      "predicted_over_measured": {r: round(predicted[r] / whole[r], 3)
                                                                  for r in (1, 8) if whole[r]}}
    del engine, seqs, fresh
    release_memory(check.device)
    return out


def identity_8b(check: GpuCheck, deadline: Deadline) -> dict[str, Any]:
    """Rows alone against the same rows in blocks beside batch-mates, bit for bit, canonical and free."""
    import random

    from sim.bench.invariance import compare_trial

    big, _ = check.shapes
    engine = build_engine(big, device=check.device, dtype=check.torch_dtype, shapes="auto")
    out: dict[str, Any] = {"padding": repr(engine.padding), "row_invariant_products": engine.invariant}
    from cloud.invariance.padding import RowPadding

    fixed = RowPadding(multiple=False, tile=FIXED_ROWS[1])  # every compared forward holds fewer rows than this
    variants = {"canonical": (3, _every_forward_canonical(engine)), "free": (2, contextlib.nullcontext()),
                f"fixed {fixed.tile} rows": (2, contextlib.ExitStack())}
    for name, (trials, shapes) in variants.items():
        rng = random.Random(1)
        identical, worst, rows, done = 0, 0.0, 0, 0
        if name.startswith("fixed"):
            shapes.enter_context(_every_forward_canonical(engine))
            shapes.enter_context(_padded_to(engine, fixed))
        with shapes:
            for _ in range(trials):
                if deadline.passed:
                    out["cut_short"] = True
                    break
                same, diff, compared = compare_trial(engine, rng, length=(40, 64), start=(5, 24))
                identical, worst, rows, done = identical + same, max(worst, diff), rows + compared, done + 1
        out[name] = {"trials": done, "identical_trials": identical, "rows_compared": rows,
                     "bit_identical": done > 0 and identical == done, "max_abs_diff": worst}
    del engine
    release_memory(check.device)
    return out


def rows_70b(check: GpuCheck, deadline: Deadline) -> dict[str, Any]:
    """The 70B shape's first layers: a forward by rows, per layer, and extrapolated to all its layers."""
    _, big = check.shapes
    engine = build_engine(big, device=check.device, dtype=check.torch_dtype, shapes="free", layers=max(SLICE_LAYERS))
    rows_list = (1, 8, 32, 128)
    fit = _by_layers(check, engine, SLICE_LAYERS, rows_list, max(3, check.repeats // 2))
    extrapolated = {rows: round(fit["fixed_ms"][rows] + big.layers * fit["per_layer_ms"][rows], 2) for rows in rows_list}
    del engine
    release_memory(check.device)
    return {"model": big.name, "layers_measured": list(SLICE_LAYERS), "layers": big.layers,
            "params_b": round(big.params / 1e9, 2), "weights_gb_bf16": round(2 * big.params / 1e9, 1), **fit,
            "extrapolated_ms": extrapolated,
            "how": f"fixed + {big.layers} x per-layer ms, each a least-squares line over the slice's layer counts; "
                   "one GPU's time if the whole model fit on it (it does not: 8 GPUs share it under tensor "
                   "parallelism, each streaming an eighth of the weights plus two all-reduces a layer)"}


SECTION_RUNS = {"machine": machine, "products": products, "rows_8b": rows_8b, "identity_8b": identity_8b,
                "rows_70b": rows_70b, "service": service, "service_8b": service_8b}


def _provenance(check: GpuCheck) -> dict[str, Any]:
    from sim.experiment.provenance import provenance

    made = provenance()
    if check.device.startswith("cuda") and torch.cuda.is_available():
        made["machine"] += f", {torch.cuda.get_device_name()}"
    return made


def run_gpu_check(check: GpuCheck) -> dict[str, Any]:
    """Every section of ``check.sections`` in turn (the module docstring); the report, written to
    ``check.out / "gpu_check.json"`` after each section."""
    check.out.mkdir(parents=True, exist_ok=True)
    path = check.out / "gpu_check.json"
    report: dict[str, Any] = { "device": check.device, "dtype": check.dtype,
                              "dry_run": check.dry_run, "budget_s": check.budget_s, "provenance": _provenance(check),
                              "sections": {}}
    started = time.perf_counter()
    for name in check.sections:
        left = check.budget_s - (time.perf_counter() - started)
        if left <= 0:
            report["sections"][name] = {"skipped": "the budget was spent"}
            continue
        check.progress(f"gpu check: {name} (up to {SHARE[name] * check.budget_s:.0f}s; {left:.0f}s of the budget left)")
        begun = time.perf_counter()
        try:
            result = SECTION_RUNS[name](check, Deadline(SHARE[name] * check.budget_s))
        except Exception as exc:  # noqa: BLE001 - one section's failure is reported, the others still run
            result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=8)}
            release_memory(check.device)
        result["seconds"] = round(time.perf_counter() - begun, 1)
        report["sections"][name] = result
        check.progress(f"gpu check: {name} done in {result['seconds']}s" + (f": {result['error']}" if "error" in result else ""))
        report["seconds"] = round(time.perf_counter() - started, 1)
        path.write_text(json.dumps(report, indent=1, default=str))
    return report


def exit_status(report: dict[str, Any]) -> int:
    """1 if a section failed or a service session differed from target-only, else 0."""
    failed = [name for name, section in report["sections"].items() if "error" in section]
    differed = [name for name in ("service", "service_8b") if report["sections"].get(name, {}).get("all_identical") is False]
    return 1 if failed or differed else 0


SERVICE_KEYS = ("padding", "serves_reproducible", "split_identical", "cloud_only_batched_identical", "sessions", "refused",
                "largest_forward_rows", "accepted", "drafted")


def summary(report: dict[str, Any]) -> str:
    """The report in a few lines (the full numbers are in gpu_check.json)."""
    lines = [f"gpu check on {report['device']}/{report['dtype']} in {report.get('seconds')}s"]
    for name, section in report["sections"].items():
        if "error" in section or "skipped" in section:
            lines.append(f"  {name}: {section.get('error') or section.get('skipped')}")
            continue
        keys = {"machine": ("device", "copy_gb_per_s", "matmul_tflop_per_s"), "products": ("linear", "attention"),
                "rows_8b": ("padding", "ridge_rows_free", "ridge_rows_canonical", "prefill_ms"),
                "identity_8b": ("canonical", "free", "fixed 128 rows"), "rows_70b": ("extrapolated_ms", "per_layer_ms"),
                "service": SERVICE_KEYS, "service_8b": SERVICE_KEYS}[name]
        shown = {key: ({k: section[key][k] for k in ("all", "fixed_rows")} if name == "products" else section[key])
                 for key in keys if key in section}
        lines.append(f"  {name} ({section['seconds']}s): {json.dumps(shown, default=str)}")
    return "\n".join(lines)

