"""Free shapes' product path is measured on the machine it runs on (``cloud.invariance.free_products``)."""

from __future__ import annotations

import torch

from cloud.engine import TargetEngine
from cloud.invariance.free_products import MARGIN, PRIOR, PROBE_ROWS, FreeProducts, _choice, choose
from cloud.invariance.products import PackedLinear


def test_the_prior_stands_unless_the_other_path_is_faster_by_the_margin():
    near = {rows: (100.0, 100.0 * MARGIN * 0.99) for rows in PROBE_ROWS}  # oneDNN slower, within the margin
    assert _choice(near) == PRIOR.onednn_rows
    blas_wins = {rows: (50.0, 100.0) for rows in PROBE_ROWS}
    assert _choice(blas_wins) == ()
    onednn_wins = {rows: (100.0, 50.0) for rows in PROBE_ROWS}
    assert _choice(onednn_wins) == PROBE_ROWS  # one row included: oneDNN is faster there too


def test_a_row_count_takes_the_choice_of_the_nearest_probe_at_or_below_it():
    chosen = FreeProducts(onednn_rows=(4, 6, 9))
    assert [chosen.onednn(rows) for rows in (1, 3, 4, 5, 8, 11, 12, 100)] == [False] * 2 + [True] * 4 + [False] * 2


def _packed(engine: TargetEngine) -> list[PackedLinear]:
    return [m for m in engine.model.modules() if isinstance(m, PackedLinear)]


def test_the_choice_is_measured_once_per_machine_and_threads_then_read_back(tiny_models, tmp_path):
    engine = TargetEngine(tiny_models["target"], shapes="free")
    packed = _packed(engine)
    assert packed and engine.products == "onednn"
    first = choose(packed, cache=tmp_path)
    assert first.source == "measured" and set(first.ms) == set(PROBE_ROWS)
    again = choose(packed, cache=tmp_path)
    assert again.source.startswith("cached:") and again.onednn_rows == first.onednn_rows and again.ms == first.ms
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads != 1 else 2)  # another thread count is another measurement
        assert choose(packed, cache=tmp_path).source == "measured"
    finally:
        torch.set_num_threads(threads)
    assert len(list(tmp_path.glob("free-products-*.json"))) == 2 and not list(tmp_path.glob("*.partial-*"))


def test_each_free_product_runs_on_the_path_chosen_for_its_rows(tiny_models):
    engine = TargetEngine(tiny_models["target"], shapes="free")
    module = _packed(engine)[0]
    assert module.free is engine.free_products and engine.free_products.source != "prior"
    x = torch.randn(9, module.in_features)
    with torch.inference_mode():
        module.free = FreeProducts(onednn_rows=())
        assert torch.equal(module(x), torch.nn.functional.linear(x, module.weight, module.bias))
        module.free = FreeProducts(onednn_rows=PROBE_ROWS)
        assert torch.equal(module(x), module.padded_product(x))
    module.free = engine.free_products
