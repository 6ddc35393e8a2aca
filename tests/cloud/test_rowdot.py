"""``cloud.invariance.rowdot``: each build of our kernel for free-shape products (AVX2, AVX-512) is the
product, to float32 rounding; a row's result does not depend on the rows beside it; what a build does not
take is refused; a build that cannot run here is not offered and costs the process nothing."""

from __future__ import annotations

import math

import pytest
import torch

from cloud.invariance import rowdot
from cloud.invariance.free_products import PATHS, ROWDOT, ROWDOT_ISA, _measure
from cloud.invariance.products import PackedLinear

pytestmark = pytest.mark.skipif(not rowdot.available(), reason="rowdot needs x86-64 with AVX2 and FMA and a C compiler")

ISAS = [pytest.param(isa, marks=pytest.mark.skipif(not rowdot.available(isa), reason=f"this CPU has no {isa}"))
        for isa in rowdot.ISAS]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(("out_features", "in_features"), [(1, 16), (7, 64), (130, 192), (1027, 640)])
def test_rowdot_is_the_product_for_every_row_count_and_a_weight_of_any_height(isa, out_features, in_features):
    generator = torch.Generator().manual_seed(out_features)
    weight = torch.randn(out_features, in_features, generator=generator)
    for rows in range(0, 14):  # every build's blocks of rows (3 or 6) and their remainders
        x = torch.randn(rows, in_features, generator=generator)
        got = rowdot.rowdot(x, weight, isa)
        want = (x.double() @ weight.double().t()).float()
        assert got.shape == (rows, out_features) and got.is_contiguous() and got.dtype == torch.float32
        # float32 rounding of a sum of `in_features` products, each of magnitude ~1
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * math.sqrt(in_features)), (rows, out_features)


@pytest.mark.parametrize("isa", ISAS)
def test_a_row_gives_the_same_bits_alone_as_beside_any_other_rows(isa):
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(1030, 640, generator=generator)
    x = torch.randn(16, 640, generator=generator)
    together = rowdot.rowdot(x, weight, isa)
    for row in range(16):
        assert torch.equal(rowdot.rowdot(x[row:row + 1], weight, isa), together[row:row + 1])
        assert torch.equal(rowdot.rowdot(x[row:], weight, isa)[0], together[row])  # another place in a block


@pytest.mark.parametrize("isa", ISAS)
def test_what_rowdot_does_not_take_is_refused_with_the_reason(isa):
    lanes = rowdot.ISAS[isa].lanes
    weight = torch.randn(16, 64)
    with pytest.raises(ValueError, match=f"divisible by {lanes}"):
        rowdot.rowdot(torch.randn(2, lanes + 4), torch.randn(16, lanes + 4), isa)
    with pytest.raises(ValueError, match="float32"):
        rowdot.rowdot(torch.randn(2, 64, dtype=torch.float64), weight.double(), isa)
    with pytest.raises(ValueError, match=r"\[rows, 64\]"):
        rowdot.rowdot(torch.randn(2, 32), weight, isa)
    assert rowdot.supports(weight, isa) and not rowdot.supports(torch.randn(16, lanes + 4), isa)


def test_a_weight_rowdot_does_not_take_is_measured_as_never_faster():
    with torch.inference_mode():
        takes, refuses = PackedLinear(torch.nn.Linear(64, 16, bias=False)), PackedLinear(torch.nn.Linear(12, 16, bias=False))
        ms = _measure([takes, refuses])
    for path, isa in ROWDOT_ISA.items():
        assert all(math.isfinite(t[PATHS.index(path)]) == rowdot.available(isa) for t in ms[(64, 16)].values())
        assert all(t[PATHS.index(path)] == math.inf for t in ms[(12, 16)].values())
    assert all(math.isfinite(t[PATHS.index(ROWDOT)]) for t in ms[(64, 16)].values())


def test_a_build_that_dies_in_its_probe_is_not_offered_and_not_kept(tmp_path, monkeypatch, caplog):
    """A CPU may name an instruction set its system has not enabled (VMs do with AMX): the first call then
    dies on an illegal instruction. The probe runs in a child, so the child dies, not the caller."""
    monkeypatch.setenv("SPLITSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(rowdot, "_PROBE", "import os, signal; os.kill(os.getpid(), signal.SIGILL)")
    rowdot._library.cache_clear()
    try:
        assert not rowdot.available(rowdot.AVX2) and not rowdot.supports(torch.randn(16, 64))
        assert "probing" in caplog.text and not list(tmp_path.glob("rowdot-*.so"))
    finally:
        monkeypatch.undo()
        rowdot._library.cache_clear()
    assert rowdot.available(rowdot.AVX2)  # (the real probe, in the real cache, passes)
