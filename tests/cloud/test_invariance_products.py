"""Packed products for canonical shapes: a swap that keeps the model's parameters, canonical products on
rowdot's widest build where it takes the weight (else oneDNN), row-invariant at the tile the engine finds,
free shapes' lone row on F.linear, and the fallback."""

from __future__ import annotations

import pytest
import torch

from cloud.device import torch_threads
from cloud.invariance import rowdot
from cloud.invariance.free_products import ONEDNN, ROWDOT, ROWDOT512, ROWDOT_ISA
from cloud.invariance.padding import RowPadding
from cloud.invariance.probe import attention_products, invariant_row_padding, linear_products
from cloud.invariance.products import (
    PackedLinear,
    canonical_path,
    onednn_available,
    pack_linears,
    unpack_linears,
)
from cloud.slot_attention import RowLayout, using_layout

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96, bias=False), torch.nn.GELU(), torch.nn.Linear(96, 64))
    return model.eval()


def test_packing_keeps_the_parameters_and_the_function():
    model = _model()
    x = torch.randn(5, 64)
    want = model(x)
    weights = [m.weight for m in model if isinstance(m, torch.nn.Linear)]
    assert pack_linears(model) == 2 and all(isinstance(model[i], PackedLinear) for i in (0, 2))
    assert [model[0].weight, model[2].weight] == weights and model[2].bias is not None  # the same tensors
    with torch.inference_mode(), using_layout(RowLayout([], [], RowPadding(False, tile=2))):
        torch.testing.assert_close(model(x), want, atol=1e-5, rtol=1e-5)  # canonical, the bias after
    with torch.inference_mode():
        one = x[:1]
        assert torch.equal(model[0](one), torch.nn.functional.linear(one, weights[0]))  # free, a lone row: F.linear
    assert unpack_linears(model) == 2 and type(model[0]) is torch.nn.Linear and model[0].weight is weights[0]
    torch.testing.assert_close(model(x), want)


def test_canonical_products_take_rowdots_widest_build_that_takes_the_weight_else_onednn():
    builds = [path for path in (ROWDOT512, ROWDOT) if rowdot.available(ROWDOT_ISA[path])]
    with torch_threads(1):
        assert canonical_path(torch.randn(16, 64)) == (builds[0] if builds else ONEDNN)
    assert canonical_path(torch.randn(16, 12)) == ONEDNN  # (no build takes a width of 12)
    assert canonical_path(torch.randn(16, 64, dtype=torch.float64)) == ONEDNN
    assert canonical_path(torch.randn(16, 64), threads=1) == (builds[0] if builds else ONEDNN)
    assert canonical_path(torch.randn(16, 64), threads=2) == ONEDNN  # (rowdot runs on one thread: oneDNN splits)


CANONICAL_PATHS = [ONEDNN] + [
    pytest.param(path, marks=pytest.mark.skipif(not rowdot.available(isa), reason=f"this CPU runs no rowdot {isa}"))
    for path, isa in ROWDOT_ISA.items()]


@pytest.mark.parametrize("path", CANONICAL_PATHS)
def test_canonical_products_are_row_invariant_at_the_tile_the_check_finds(path):
    model = _model()
    pack_linears(model)
    model[0].canonical = model[2].canonical = path
    padding = invariant_row_padding(linear_products(model))
    assert padding is not None
    product = model[0].canonical_product
    rows = torch.randn(40, 64)
    with torch.inference_mode():
        full = product(rows)
        for m in (1, 2, 3, 7, 17, 33):
            got = product(torch.cat([rows[:m], rows.new_zeros(padding(m) - m, 64)]))[:m]
            assert torch.equal(got, full[:m]), m
    assert not onednn_available(torch.nn.Sequential(torch.nn.Linear(4, 4).double()))


def test_the_tiny_engine_runs_canonical_products_packed_with_attention_at_its_own_tile(tiny_engine):
    assert tiny_engine.products == "onednn" and tiny_engine.padding == RowPadding(False, tile=2)
    packed = [m for m in tiny_engine.model.modules() if isinstance(m, PackedLinear)]
    assert packed and all(m.canonical == canonical_path(m.weight) for m in packed)
    assert tiny_engine.attention_padding is not None
    assert invariant_row_padding(attention_products(tiny_engine.model)) is not None or tiny_engine.threads == 1
    assert tiny_engine.rows_at_cost_of(1, reproducible=True) == 2 and tiny_engine.rows_at_cost_of(3) == 3
