"""Hardware profiles from a GPU check's report: the performance model's targets, measured on the GPU.

``splitspec bench gpu-profiles REPORT OUT_DIR`` reads ``gpu_check.json`` (``sim.bench.gpu_check``) and
writes two profiles ``splitspec sim model --hardware`` reads (``sim.perf.hardware_profile``):

- ``h200-llama8b.toml``, measured: a one-session verify's fixed cost (the median of the flat part of
  the free-shape curve), its per-row slope there (a least-squares line), where the fixed part starts
  to grow (fitted through the largest forward measured), what each sequence past the first adds to a
  packed forward (a least-squares line over the batched forwards), and a 512-token prefill.
- ``h200-llama70b.toml``, extrapolated: the 70B shape's forward from its 1-, 2- and 4-layer slices
  (fixed + 80 x per-layer, as ``gpu_check`` reports it) on one GPU that would hold it (none does: its
  bf16 weights are 141 GB); its ridge, per-sequence cost and prefill scaled from the 8B's by what
  each scales with (the roofline's rows, layers, parameters), each said in the file.

Neither measures a drafter, acceptance or bytes: those are the assumed profile's
(``llama70b-8xh100-mac``: Llama-3.2-1B Q4 on an M-series Mac, alpha 0.8), copied and marked so.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from sim.bench.gpu_check import ALIKE, fit_line, ridge

__all__ = ["profiles_from_report", "write_profiles"]

ASSUMED = "llama70b-8xh100-mac"


def _slope(points: list[tuple[float, float]]) -> float:
    """The least-squares slope over (x, y) points (``fit_line``)."""
    return fit_line(points)[1]


def measured_8b(report: dict[str, Any]) -> dict[str, float]:
    """The 8B's target figures (ms, rows) from a report's ``rows_8b`` and ``machine`` sections."""
    rows = report["sections"]["rows_8b"]
    curve = {int(n): ms["median"] for n, ms in rows["one_session_free"].items()}
    alike = ridge(rows["one_session_free"])
    flat = statistics.median(ms for n, ms in curve.items() if n <= alike)
    largest = max(curve)
    fixed_grows_at = largest * flat / curve[largest] if curve[largest] > ALIKE * flat else float(largest)
    batched = [(int(key.split()[0]), value["free"]["median"]) for key, value in rows["batched"].items()]
    return {"verify_fixed_ms": round(flat, 2),
            "verify_per_token_ms": round(max(_slope([(n, ms) for n, ms in curve.items() if n <= alike]), 0.0), 4),
            "ridge_rows": round(fixed_grows_at), "alike_rows": alike,
            "verify_per_sequence_ms": round(max(_slope(batched), 0.0), 2),
            "prefill_ms": round(rows["prefill_ms"]["512"]["median"], 1)}


def _toml(name: str, description: str, target: dict[str, Any], notes: list[str], assumed: str) -> str:
    lines = [f"name = {json.dumps(name)}", f"description = {json.dumps(description)}", "", "[target]"]
    lines += [f"# {note}" for note in notes]
    for key, value in target.items():
        lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n\n" + assumed


def _assumed_sections() -> str:
    """The assumed profile's [drafter], [acceptance] and [bytes] tables as its file has them (comments kept),
    marked as not measured here."""
    text = (Path(__file__).resolve().parents[1] / "perf" / "hardware" / f"{ASSUMED}.toml").read_text()
    start = text.index("[drafter]")
    return (f"# Not measured on the GPU: the drafter, the acceptance and the bytes are {ASSUMED}'s assumptions, "
            "copied.\n" + text[start:])


def profiles_from_report(report: dict[str, Any], source: str) -> dict[str, str]:
    """File name -> TOML text of the two profiles (module docstring); ``source``: where the report is."""
    machine = report["sections"]["machine"]
    provenance = report.get("provenance", {})
    made = f"from {source} (commit {str(provenance.get('commit'))[:7]}, {provenance.get('machine')})"
    m8 = measured_8b(report)
    params_8b = report["sections"]["rows_8b"]["params_b"]
    weights_8b, bandwidth = 2 * params_8b * 1e9, machine["copy_gb_per_s"] * 1e9  # bf16 bytes; bytes read + written a second
    assumed = _assumed_sections()
    eight = _toml(
        "h200-llama8b", f"Llama-3.1-8B's shapes (random weights), bf16, one H200, through splitspec's engine in free "
        f"shapes; target figures measured {made}. Drafter and acceptance assumed.",
        {"model": "Llama-3.1-8B shapes, bf16, one H200 (transformers + splitspec's engine, free shapes)",
         **{key: m8[key] for key in ("verify_fixed_ms", "verify_per_token_ms", "ridge_rows", "verify_per_sequence_ms",
                                     "prefill_ms")}, "vocab_size": 128256},
        [f"verify_fixed_ms: the median of one session's forwards from 1 to {m8['alike_rows']} rows (they cost alike, "
         f"within {ALIKE:g}x of the cheapest); reading the weights once would take {weights_8b / bandwidth * 1e3:.1f} "
         f"ms ({weights_8b / 1e9:.2f} GB at the {bandwidth / 1e9:.0f} GB/s a copy moved): the forward is host-bound "
         "(Python and launches, ~0.8 ms a layer)",
         "verify_per_token_ms: the slope over those rows; ridge_rows: where the fixed part, fitted through the "
         "largest forward measured, starts to grow",
         "verify_per_sequence_ms: what each session past the first adds to a packed forward (its attention, "
         "span by span), a least-squares line over 1, 8 and 32 sessions; prefill_ms: 512 tokens"],
        assumed)
    rows70 = report["sections"]["rows_70b"]
    extrapolated = {int(n): ms for n, ms in rows70["extrapolated_ms"].items()}
    rate = machine["matmul_tflop_per_s"] * 1e12
    fixed70 = extrapolated[1]
    # The roofline's ridge at a fixed cost: the rows whose products alone take that long at the measured rate.
    roofline_8b, roofline_70b = (fixed / (2 * params * 1e9 / rate * 1e3)
                                 for fixed, params in ((m8["verify_fixed_ms"], params_8b), (fixed70, rows70["params_b"])))
    ridge70 = round(roofline_70b * m8["ridge_rows"] / roofline_8b)
    check = report["sections"]["rows_8b"]["layer_extrapolation"]["predicted_over_measured"]
    seventy = _toml(
        "h200-llama70b", f"Llama-3.1-70B's shapes (random weights), bf16, on ONE H200 as if it held the weights (it "
        f"does not: 141 GB), extrapolated from 1-, 2- and 4-layer slices {made}. Drafter and acceptance assumed.",
        {"model": "Llama-3.1-70B shapes, bf16, one H200 (extrapolated from a slice; transformers + splitspec's engine)",
         "verify_fixed_ms": round(fixed70, 2),
         "verify_per_token_ms": round(max(_slope(list(extrapolated.items())), 0.0), 4),
         "ridge_rows": ridge70,
         "verify_per_sequence_ms": round(m8["verify_per_sequence_ms"] * rows70["layers"] / 32, 2),
         "prefill_ms": round(m8["prefill_ms"] * rows70["params_b"] / params_8b, 1), "vocab_size": 128256},
        [f"verify_fixed_ms: fixed + {rows70['layers']} x per-layer ms at one row (each a least-squares line over the "
         "slice's layer counts); the same method put the 8B's whole forward at "
         + " and ".join(f"{ratio:g}x (at {rows} rows)" for rows, ratio in check.items()) + " of what it measured",
         f"ridge_rows: the roofline's rows at this fixed cost ({roofline_70b:.0f}), scaled as the 8B's measured ridge "
         f"stood to its roofline's ({m8['ridge_rows']} against {roofline_8b:.0f})",
         "verify_per_sequence_ms: the 8B's, times 80/32 layers (a session's attention launches a layer); "
         "prefill_ms: the 8B's 512 tokens times the parameters (compute-bound)",
         "Under tensor parallelism over 8 GPUs each would stream an eighth of the weights, but the host's part "
         "(~0.8 ms a layer here) does not shrink with the GPUs"],
        assumed)
    return {"h200-llama8b.toml": eight, "h200-llama70b.toml": seventy}


def write_profiles(report_path: Path, out: Path) -> list[Path]:
    """The profiles of the report at ``report_path``, written into ``out``; their paths."""
    report = json.loads(report_path.read_text())
    written = []
    for name, text in profiles_from_report(report, report_path.as_posix()).items():
        (out / name).write_text(text)
        written.append(out / name)
    return written
