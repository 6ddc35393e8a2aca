"""A fixed forward shape: where a GPU's products keep a row's bits at no row tile but at one shape (an H200's
cuBLAS, ``docs/results/2026-12-04-gpu-check/``), canonical forwards run exactly that many rows and the
scheduler never packs more. Checked here on the CPU's products, which hold at fixed shapes too."""

from __future__ import annotations

import pytest

from cloud.invariance.padding import RowPadding
from cloud.invariance.probe import Product, fixed_shape_holds, fixed_shape_padding, linear_products


def test_the_cpu_products_hold_at_a_fixed_shape_and_a_row_mixing_product_does_not(tiny_engine):
    products = linear_products(tiny_engine.model)
    assert fixed_shape_padding(products) == RowPadding(multiple=False, tile=256, fixed=True)
    weight = products[0].like
    mixing = Product(weight.shape[1], weight, lambda x: x @ weight.T - (x @ weight.T).mean(0, keepdim=True))
    assert not fixed_shape_holds([mixing], 64)  # the control: a row's output depends on its batch-mates
    assert fixed_shape_padding([*products, mixing]) is None


def test_a_fixed_padding_runs_its_shape_and_refuses_more_rows():
    fixed = RowPadding(multiple=False, tile=64, fixed=True)
    assert [fixed(n) for n in (1, 17, 64)] == [64, 64, 64]
    with pytest.raises(ValueError, match="only at one shape, 64 rows"):
        fixed(65)


def test_sessions_on_a_fixed_shape_engine_match_target_only_and_no_forward_passes_it(tiny_models):
    from cloud.engine import ForwardItem, TargetEngine
    from sim.bench.gpu_service import serve_sessions

    engine = TargetEngine(tiny_models["target"], shapes="canonical")
    engine.padding = RowPadding(multiple=False, tile=64, fixed=True)  # as the engine picks on an H200 (at 256)
    assert engine.max_forward_rows == 64 and engine.serves_reproducible
    with pytest.raises(ValueError, match="only at one shape"):
        engine.forward_batch([ForwardItem(engine.new_sequence(), list(range(3, 70)))])
    prompts = [[1, *range(5 + i, 60 + 7 * i)] for i in range(4)]  # four prefills together pass 64 rows
    out = serve_sessions(engine, prompts, 24)
    assert out["all_identical"], out
    assert out["largest_forward_rows"] == 64
