"""Free shapes' product paths are measured on the machine they run on, per weight shape and row count
(``cloud.invariance.free_products``)."""

from __future__ import annotations

import json
import math

import torch

from cloud.engine import TargetEngine
from cloud.invariance import rowdot
from cloud.invariance.free_products import (
    BLAS,
    BLAS_WX,
    MARGIN,
    ONEDNN,
    PATHS,
    PRIOR,
    PROBE_ROWS,
    ROWDOT,
    ROWDOT512,
    ROWDOT_ISA,
    FreeProducts,
    _choice,
    choose,
    prior_path,
)
from cloud.invariance.products import PackedLinear

PRIOR_PATHS = tuple(prior_path(rows) for rows in PROBE_ROWS)


def _times(blas: float, onednn: float, wx: float, rd: float = math.inf, rd512: float = math.inf
           ) -> dict[int, tuple[float, ...]]:
    """Each probe row count's milliseconds per path, in ``PATHS``' order (rowdot's builds: not run, by default)."""
    by_path = {BLAS: blas, ONEDNN: onednn, BLAS_WX: wx, ROWDOT: rd, ROWDOT512: rd512}
    return {rows: tuple(by_path[p] for p in PATHS) for rows in PROBE_ROWS}


def test_the_prior_stands_unless_another_path_is_faster_by_the_margin_then_the_fastest_wins():
    near = 100.0 / MARGIN * 1.01  # faster than 100, within the margin
    assert _choice(_times(100.0, 100.0, near)) == PRIOR_PATHS
    assert _choice(_times(50.0, 100.0, 100.0)) == (BLAS,) * len(PROBE_ROWS)
    assert _choice(_times(100.0, 50.0, 100.0)) == (ONEDNN,) * len(PROBE_ROWS)  # one row included
    assert _choice(_times(100.0, 60.0, 50.0)) == (BLAS_WX,) * len(PROBE_ROWS)  # the fastest of those past the margin
    assert _choice(_times(100.0, 60.0, 50.0, 40.0)) == (ROWDOT,) * len(PROBE_ROWS)
    assert _choice(_times(100.0, 60.0, 50.0, 40.0, 35.0)) == (ROWDOT512,) * len(PROBE_ROWS)
    assert _choice(_times(100.0, 100.0, 100.0, math.inf)) == PRIOR_PATHS  # (a path that cannot run is never chosen)


def test_a_product_takes_its_shapes_choice_at_the_nearest_probe_at_or_below_its_rows():
    paths = tuple(BLAS_WX if rows in (4, 6, 9) else BLAS for rows in PROBE_ROWS)
    chosen = FreeProducts({(640, 1024): paths})
    assert [chosen.path((640, 1024), rows) for rows in (1, 3, 4, 5, 8, 11, 12, 100)] == [BLAS] * 2 + [BLAS_WX] * 4 + [BLAS] * 2
    assert [chosen.path((1024, 640), rows) for rows in (1, 2, 100)] == [BLAS, ONEDNN, ONEDNN]  # another shape: the prior
    assert [PRIOR.path((640, 1024), rows) for rows in (1, 2, 100)] == [BLAS, ONEDNN, ONEDNN]


def _packed(engine: TargetEngine) -> list[PackedLinear]:
    return [m for m in engine.model.modules() if isinstance(m, PackedLinear)]


def test_the_choice_is_measured_once_per_machine_and_threads_then_read_back(tiny_models, tmp_path):
    engine = TargetEngine(tiny_models["target"], shapes="free")
    packed = _packed(engine)
    assert packed and engine.products == "onednn"
    first = choose(packed, cache=tmp_path)
    shapes = {(m.in_features, m.out_features) for m in packed}
    assert first.source == "measured" and set(first.ms) == set(first.paths) == shapes
    assert all(set(by_rows) == set(PROBE_ROWS) and all(len(t) == len(PATHS) for t in by_rows.values())
               for by_rows in first.ms.values())
    again = choose(packed, cache=tmp_path)
    assert again.source.startswith("cached:") and again.paths == first.paths and again.ms == first.ms
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads != 1 else 2)  # another thread count is another measurement
        assert choose(packed, cache=tmp_path).source == "measured"
    finally:
        torch.set_num_threads(threads)
    assert len(list(tmp_path.glob("free-products-*.json"))) == 2 and not list(tmp_path.glob("*.partial-*"))


def test_a_cached_choice_that_names_an_unknown_path_is_measured_again(tiny_models, tmp_path):
    packed = _packed(TargetEngine(tiny_models["target"], shapes="free"))
    choose(packed, cache=tmp_path)
    (cached,) = tmp_path.glob("free-products-*.json")
    data = json.loads(cached.read_text())
    data["paths"] = {shape: ["gpu"] * len(PROBE_ROWS) for shape in data["paths"]}
    cached.write_text(json.dumps(data))
    again = choose(packed, cache=tmp_path)
    assert again.source == "measured" and all(set(paths) <= set(PATHS) for paths in again.paths.values())
    assert choose(packed, cache=tmp_path).paths == again.paths  # (and cached in its place)


def test_each_free_product_runs_on_the_path_chosen_for_its_shape_and_rows(tiny_models, monkeypatch):
    import cloud.invariance.products as products

    engine = TargetEngine(tiny_models["target"], shapes="free")
    module = _packed(engine)[0]
    shape = (module.in_features, module.out_features)
    assert module.free is engine.free_products and engine.free_products.source != "prior"
    ran: list[str] = []
    run_path = products.run_path
    monkeypatch.setattr(products, "run_path", lambda path, *args: ran.append(path) or run_path(path, *args))
    x = torch.randn(2, 9, module.in_features)  # (a batch dimension too: the product flattens it)
    bias = module.bias if module.bias is not None else 0.0
    with torch.inference_mode():
        by_path = {}
        for path in [p for p in PATHS if p not in ROWDOT_ISA or rowdot.supports(module.weight, ROWDOT_ISA[p])]:
            module.free = FreeProducts({shape: (path,) * len(PROBE_ROWS)})
            ran.clear()
            by_path[path] = module(x)
            assert ran == ([] if path == BLAS else [path])  # (the BLAS's own path is F.linear, with its bias)
        assert torch.equal(by_path[BLAS], torch.nn.functional.linear(x, module.weight, module.bias))
        onednn = run_path(ONEDNN, x.reshape(-1, module.in_features), module.weight, module.packed)
        assert torch.equal(by_path[ONEDNN], onednn.reshape(2, 9, -1) + bias)
        wx = torch.mm(module.weight, x.reshape(-1, module.in_features).t()).t().reshape(2, 9, -1) + bias
        assert torch.equal(by_path[BLAS_WX], wx) and by_path[BLAS_WX].is_contiguous()
        for path in set(by_path) & set(ROWDOT_ISA):
            flat = rowdot.rowdot(x.reshape(-1, module.in_features), module.weight, ROWDOT_ISA[path])
            assert torch.equal(by_path[path], flat.reshape(2, 9, -1) + bias)
        for path in set(by_path) - {BLAS}:  # the same product: the paths differ in the last bits at most
            assert torch.allclose(by_path[path], by_path[BLAS], rtol=1e-4, atol=1e-5)
    module.free = engine.free_products


def test_another_rowdot_build_is_timed_anew(tiny_models, tmp_path, monkeypatch):
    packed = _packed(TargetEngine(tiny_models["target"], shapes="free"))
    assert choose(packed, cache=tmp_path).source == "measured"
    assert choose(packed, cache=tmp_path).source.startswith("cached:")
    build_id = rowdot.build_id
    for isa in [isa for isa in rowdot.ISAS if rowdot.available(isa)]:  # (one that does not run is not in the key)
        monkeypatch.setattr(rowdot, "build_id", lambda other, isa=isa: "another" if other == isa else build_id(other))
        assert choose(packed, cache=tmp_path).source == "measured", isa
