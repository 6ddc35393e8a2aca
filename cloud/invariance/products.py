"""The matrix products of canonical shapes: oneDNN's inner product where the BLAS path is invariant only
at a bigger row tile.

A reproducible row must get the same bits whatever else its forward holds, so
canonical shapes pad every product to a row tile at which the kernels are
row-invariant (``cloud.slot_attention``). ``F.linear`` goes to MKL's SGEMM,
whose kernels change with the row count: on the 2-core Xeon (MKL 2024.2,
oneDNN 3.12; ``docs/results/2026-12-02-products/``) it is row-invariant
only from 16 rows on one thread, at no tile on two. oneDNN's inner product on
a weight packed once is row-invariant from 2 rows on one and two threads, and
cheaper from 4 rows on. Gemma's 262144 x 640 head, one thread: one row 46 ms
unpadded; padded, 151 ms on SGEMM's 16 rows against 61 ms on oneDNN's 2; nine
rows 157 ms against 79 ms.

Contract. ``pack_linears(model)`` swaps every ``nn.Linear`` of a float32 CPU
model for a ``PackedLinear`` (same parameters, so tied weights stay tied,
plus a oneDNN copy of the weight: the linear weights' memory twice) and
returns how many it swapped (0 where oneDNN is unavailable or a weight is a
tensor-parallel shard); ``unpack_linears`` undoes it. A ``PackedLinear``
runs ``F.linear`` on a lone row in free shapes (MKL's one-row kernel is the
fastest there) and oneDNN's product otherwise: always in canonical shapes,
and on several rows in free shapes too, where it is the faster (the whole
Gemma forward on one thread, 9 rows: 161 ms against 244 ms). That free-shape
rule is the prior; the engine replaces it with what it measures on its own
machine, per weight shape and row count, the BLAS on the transposed product
``(W · xᵀ)ᵀ`` and our own kernel's AVX2 and AVX-512 builds (``cloud.invariance.rowdot``)
among the paths there (``cloud.invariance.free_products``).
"""

from __future__ import annotations

import torch

from cloud import slot_attention
from cloud.invariance.free_products import BLAS, ONEDNN, PRIOR, FreeProducts, run_path

__all__ = ["PackedLinear", "onednn_available", "pack_linears", "unpack_linears"]


def onednn_available(model: torch.nn.Module) -> bool:
    """Whether this torch has oneDNN (mkldnn) and every linear weight of ``model`` is a float32 CPU tensor."""
    if not torch.backends.mkldnn.is_available():
        return False
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return bool(weights) and all(type(w.data) is torch.Tensor and w.device.type == "cpu" and w.dtype == torch.float32
                                 for w in weights)


class PackedLinear(torch.nn.Linear):
    """An ``nn.Linear`` whose canonical-shape products run on oneDNN (the module docstring); in free
    shapes, on the path ``free`` chose for its weight's shape and the row count on this machine
    (``free_products``)."""

    free: FreeProducts = PRIOR  # (the engine sets what it measured)

    def path_at(self, rows: int) -> str:
        """The path a free-shape product of ``rows`` rows takes (``RowPaddedHead`` pads no free-shape
        product of a head that has this: the path per row count was chosen for it)."""
        return self.free.path((self.in_features, self.out_features), rows)

    def __init__(self, linear: torch.nn.Linear) -> None:
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias  # the same parameters
        self.packed = linear.weight.detach().to_mkldnn()  # [out, in], oneDNN's layout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layout = slot_attention.current_layout()
        if layout is not None and layout.padding is not None:
            return self.padded_product(x)  # canonical shapes
        path = self.path_at(x.numel() // x.shape[-1])
        if path == BLAS:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        if path == ONEDNN:
            return self.padded_product(x)
        flat = run_path(path, x.reshape(-1, x.shape[-1]), self.weight, self.packed)  # (W·xᵀ)ᵀ or rowdot
        out = flat if self.bias is None else flat + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def padded_product(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ weight.T (+ bias)`` on oneDNN; [..., in] -> [..., out]. The bias is added after the
        product, elementwise (row-invariant whatever the product)."""
        flat = run_path(ONEDNN, x.reshape(-1, x.shape[-1]).contiguous(), self.weight, self.packed)
        if self.bias is not None:
            flat = flat + self.bias
        return flat.reshape(*x.shape[:-1], self.out_features)


def _swap(model: torch.nn.Module, make) -> int:
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            replacement = make(child)
            if replacement is not None:
                setattr(parent, name, replacement)
                swapped += 1
    return swapped


def pack_linears(model: torch.nn.Module) -> int:
    """Swap every ``nn.Linear`` for a ``PackedLinear``; how many (0: oneDNN cannot serve this model)."""
    if not onednn_available(model):
        return 0
    return _swap(model, lambda m: PackedLinear(m) if type(m) is torch.nn.Linear else None)


def unpack_linears(model: torch.nn.Module) -> int:
    """Undo ``pack_linears`` (plain ``nn.Linear`` modules on the same parameters); how many."""

    def plain(module: torch.nn.Module) -> torch.nn.Linear | None:
        if not isinstance(module, PackedLinear):
            return None
        linear = torch.nn.Linear(module.in_features, module.out_features, bias=False, device="meta")
        linear.weight, linear.bias = module.weight, module.bias
        return linear

    return _swap(model, plain)
