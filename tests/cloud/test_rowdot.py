"""``cloud.invariance.rowdot``: our AVX2 kernel for free-shape products is the product, to float32
rounding; a row's result does not depend on the rows beside it; what it does not take is refused."""

from __future__ import annotations

import math

import pytest
import torch

from cloud.invariance import rowdot
from cloud.invariance.free_products import PATHS, ROWDOT, _measure
from cloud.invariance.products import PackedLinear

pytestmark = pytest.mark.skipif(not rowdot.available(), reason="rowdot needs x86-64 with AVX2 and FMA and a C compiler")


@pytest.mark.parametrize(("out_features", "in_features"), [(1, 8), (7, 64), (130, 192), (1027, 640)])
def test_rowdot_is_the_product_for_every_row_count_and_a_weight_of_any_height(out_features, in_features):
    generator = torch.Generator().manual_seed(out_features)
    weight = torch.randn(out_features, in_features, generator=generator)
    for rows in range(0, 11):  # the kernel's blocks of 3 rows and its remainders of 1 and 2
        x = torch.randn(rows, in_features, generator=generator)
        got = rowdot.rowdot(x, weight)
        want = (x.double() @ weight.double().t()).float()
        assert got.shape == (rows, out_features) and got.is_contiguous() and got.dtype == torch.float32
        # float32 rounding of a sum of `in_features` products, each of magnitude ~1
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * math.sqrt(in_features)), (rows, out_features)


def test_a_row_gives_the_same_bits_alone_as_beside_any_other_rows():
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(1030, 640, generator=generator)
    x = torch.randn(16, 640, generator=generator)
    together = rowdot.rowdot(x, weight)
    for row in range(16):
        assert torch.equal(rowdot.rowdot(x[row:row + 1], weight), together[row:row + 1])
        assert torch.equal(rowdot.rowdot(x[row:], weight)[0], together[row])  # another place in the block of 3


def test_what_rowdot_does_not_take_is_refused_with_the_reason():
    weight = torch.randn(16, 64)
    with pytest.raises(ValueError, match="divisible by 8"):
        rowdot.rowdot(torch.randn(2, 12), torch.randn(16, 12))
    with pytest.raises(ValueError, match="float32"):
        rowdot.rowdot(torch.randn(2, 64, dtype=torch.float64), weight.double())
    with pytest.raises(ValueError, match=r"\[rows, 64\]"):
        rowdot.rowdot(torch.randn(2, 32), weight)
    assert rowdot.supports(weight) and not rowdot.supports(torch.randn(16, 12))


def test_a_weight_rowdot_does_not_take_is_measured_as_never_faster():
    with torch.inference_mode():
        takes, refuses = PackedLinear(torch.nn.Linear(64, 16, bias=False)), PackedLinear(torch.nn.Linear(12, 16, bias=False))
        ms = _measure([takes, refuses])
    assert all(math.isfinite(t[PATHS.index(ROWDOT)]) for t in ms[(64, 16)].values())
    assert all(t[PATHS.index(ROWDOT)] == math.inf for t in ms[(12, 16)].values())
