"""The matrix products of canonical shapes: our own row-invariant kernel where it runs, else oneDNN's
inner product, where the BLAS path is invariant only at a bigger row tile.

A reproducible row must get the same bits whatever else its forward holds, so
canonical shapes pad every product to a row tile at which the kernels are
row-invariant (``cloud.slot_attention``). ``F.linear`` goes to MKL's SGEMM,
whose kernels change with the row count: on the 2-core Xeon (MKL 2024.2,
oneDNN 3.12; ``docs/results/2026-12-02-products/``) it is row-invariant
only from 16 rows on one thread, at no tile on two. oneDNN's inner product on
a weight packed once is row-invariant from 2 rows on one and two threads, and
cheaper from 4 rows on. Gemma's 262144 x 640 head, one thread: one row 46 ms
unpadded; padded, 151 ms on SGEMM's 16 rows against 61 ms on oneDNN's 2; nine
rows 157 ms against 79 ms. ``rowdot`` (``cloud.invariance.rowdot``) sums every
output in one order whatever the rows beside it, single-threaded: row-invariant
at any row count and thread count by construction, and faster than oneDNN from
two rows on one thread on both VMs measured (the head's 9 rows 69 ms against
oneDNN's 100 on a Xeon with AVX-512, 79 against the best other path's 98 on an
AMD EPYC without; ``docs/results/2026-12-07-rowdot512-xeon``,
``docs/results/2026-12-07-rowdot-epyc``). So where torch runs on one thread,
``canonical_path`` gives a weight rowdot's widest build that takes it here
(AVX-512, else AVX2); on several threads, and where no build takes it, oneDNN
(which splits a product between threads where rowdot does not). A fixed rule,
not a timing, so a machine's canonical bits do not move between loads at the
same thread count. The ``torch.equal`` probe at load (``cloud.invariance.probe``)
is the gate either way.

Contract. ``pack_linears(model)`` swaps every ``nn.Linear`` of a float32 CPU
model for a ``PackedLinear`` (same parameters, so tied weights stay tied,
plus a oneDNN copy of the weight: the linear weights' memory twice) and
returns how many it swapped (0 where oneDNN is unavailable or a weight is a
tensor-parallel shard); ``unpack_linears`` undoes it. A ``PackedLinear``
runs canonical shapes' products on its ``canonical`` path, and free shapes'
on the path measured fastest on this machine for its weight's shape and the
row count (``cloud.invariance.free_products``: the BLAS, oneDNN, the BLAS on
the transposed product ``(W · xᵀ)ᵀ``, rowdot's builds), the prior rule (the
BLAS on a lone row, oneDNN from two) where nothing was measured.
"""

from __future__ import annotations

import torch

from cloud import slot_attention
from cloud.invariance import rowdot
from cloud.invariance.free_products import BLAS, ONEDNN, PRIOR, ROWDOT, ROWDOT512, ROWDOT_ISA, FreeProducts, run_path

__all__ = ["PackedLinear", "canonical_path", "onednn_available", "pack_linears", "unpack_linears"]


def canonical_path(weight: torch.Tensor, threads: int | None = None) -> str:
    """The path canonical shapes run products against ``weight`` on, with torch on ``threads`` threads
    (default: torch's current count): on one, rowdot's AVX-512 build, else its AVX2 build, where one takes
    the weight here (``rowdot.supports``); else oneDNN (the module docstring)."""
    if (threads or torch.get_num_threads()) > 1:
        return ONEDNN
    return next((path for path in (ROWDOT512, ROWDOT) if rowdot.supports(weight, ROWDOT_ISA[path])), ONEDNN)


def onednn_available(model: torch.nn.Module) -> bool:
    """Whether this torch has oneDNN (mkldnn) and every linear weight of ``model`` is a float32 CPU tensor."""
    if not torch.backends.mkldnn.is_available():
        return False
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return bool(weights) and all(type(w.data) is torch.Tensor and w.device.type == "cpu" and w.dtype == torch.float32
                                 for w in weights)


class PackedLinear(torch.nn.Linear):
    """An ``nn.Linear`` whose canonical-shape products run on ``canonical`` (``canonical_path``); in free
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
        self.canonical = canonical_path(linear.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layout = slot_attention.current_layout()
        if layout is not None and layout.padding is not None:
            return self.product(x, self.canonical)  # canonical shapes
        path = self.path_at(x.numel() // x.shape[-1])
        if path == BLAS:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        return self.product(x, path)

    def canonical_product(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ weight.T (+ bias)`` as canonical shapes run it (on ``canonical``); [..., in] -> [..., out]."""
        return self.product(x, self.canonical)

    def product(self, x: torch.Tensor, path: str) -> torch.Tensor:
        """``x @ weight.T (+ bias)`` on ``path`` (``free_products.run_path``); [..., in] -> [..., out]. The bias
        is added after the product, elementwise (row-invariant whatever the product)."""
        flat = run_path(path, x.reshape(-1, x.shape[-1]).contiguous(), self.weight, self.packed)
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
