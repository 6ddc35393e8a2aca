"""Which row padding makes a device's products batch-invariant: probed at load, with ``torch.equal``.

``linear_products`` and ``attention_products`` list the products canonical
shapes run; ``invariant_row_padding`` finds the first tile (``ROW_TILES``) at
which each row's bits do not depend on how many rows share its product, or in
what order; ``NotRowInvariant`` is the refusal where none holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import NamedTuple

import torch

from cloud import slot_attention
from cloud.invariance.padding import KEY_BUCKET, ROW_TILE, RowPadding
from cloud.invariance.products import PackedLinear

__all__ = ["ROW_TILES", "ACCELERATOR_ROW_TILES", "Product", "linear_products", "attention_products",
           "invariant_row_padding", "holding_paddings", "row_tiles_for", "fixed_shape_holds", "fixed_shape_padding",
           "FIXED_SHAPES", "NotRowInvariant"]

ROW_TILES = (2, ROW_TILE, 8, 16)  # a CPU's tiles tried, the smallest (cheapest) first
# An accelerator's forward costs nearly alike up to its ridge (a hundred rows and more on a GPU), so a
# bigger tile costs next to nothing there, and its matrix kernels change with the row count more often.
ACCELERATOR_ROW_TILES = (*ROW_TILES, 32, 64, 128)
# Fixed forward shapes tried where no tile holds (an accelerator only: a CPU pays for every row), the
# biggest first (the scheduler's forwards are bounded by it). Measured on an H200 (cuBLAS, bfloat16,
# ``docs/results/2026-12-04-gpu-check/``): no tile held for Llama-3.1-8B's products, every fixed shape did.
FIXED_SHAPES = (256, 128, 64)
_COUNTS = (1, 2, 3, 5, 6, 7, 9, 13, 17, 31, 33, 47, 63, 65, 95, 127, 129, 191, 255, 257, 383, 511)


def row_tiles_for(device: torch.device) -> tuple[int, ...]:
    """The tiles the probe tries on ``device``: a CPU's, or an accelerator's (bigger ones too)."""
    return ROW_TILES if device.type == "cpu" else ACCELERATOR_ROW_TILES


class Product(NamedTuple):
    """A product canonical shapes run: ``run(rows [m, columns]) -> [m, n]`` on rows like ``like``'s."""

    columns: int
    like: torch.Tensor  # its device and dtype are the rows'
    run: Callable[[torch.Tensor], torch.Tensor]


def linear_products(model: torch.nn.Module) -> list[Product]:
    """One canonical product per distinct linear layer shape and path of ``model`` (``F.linear``, or a
    ``cloud.invariance.products.PackedLinear``'s canonical path: rowdot or oneDNN), the output head included."""
    def local(weight: torch.Tensor) -> torch.Tensor:  # a tensor-parallel shard is a DTensor
        return weight.to_local() if hasattr(weight, "to_local") else weight

    products: dict[tuple, Product] = {}
    for m in model.modules():
        if isinstance(m, PackedLinear):
            products.setdefault((m.canonical, *m.weight.shape), Product(m.in_features, m.weight, m.canonical_product))
        elif isinstance(m, torch.nn.Linear):
            weight = local(m.weight)
            products.setdefault(tuple(weight.shape),
                                Product(weight.shape[1], weight, partial(torch.nn.functional.linear, weight=weight)))
    return list(products.values())


def attention_products(model: torch.nn.Module) -> list[Product]:
    """Canonical attention's products (``cloud.slot_attention``) at a few key buckets: scores (rows of
    queries times keys) and the weighted values (rows of weights times values)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    weight = next(model.parameters())
    gen = torch.Generator().manual_seed(1)

    def per_kv_head(rows: torch.Tensor, other: torch.Tensor) -> torch.Tensor:  # [m, c] x [KV, c, n] -> [m, KV * n]
        return torch.matmul(rows.unsqueeze(0).repeat(kv, 1, 1), other).transpose(0, 1).reshape(rows.shape[0], -1)

    products: list[Product] = []
    for length in (KEY_BUCKET, 2 * KEY_BUCKET, 8 * KEY_BUCKET):
        keys, values = (torch.randn(kv, length, dim, generator=gen).to(weight.device, weight.dtype) for _ in range(2))
        products += [Product(dim, keys, partial(per_kv_head, other=keys.transpose(-1, -2))),
                     Product(length, values, partial(per_kv_head, other=values))]
    return products


def invariant_row_padding(products: Sequence[Product], tiles: Sequence[int] = ROW_TILES,
                          max_rows: int | None = None) -> RowPadding | None:
    """The row padding under which ``products`` give each row the same bits for any row count and
    order (with torch's current thread count): the first of ``tiles`` for which at least a tile
    of rows, else multiples of it, holds; else None. Checked on random rows, up to ``max_rows`` rows
    (default: 64, or four of the biggest tile; more than any tile, so every padded count is compared)."""
    return next(_holding(products, tiles, max_rows), None)


def holding_paddings(products: Sequence[Product], tiles: Sequence[int] = ROW_TILES,
                     max_rows: int | None = None) -> list[RowPadding]:
    """Every padding of ``tiles`` (at least a tile, and multiples of it) that ``invariant_row_padding``
    would accept, in its order: what the GPU check reports."""
    return list(_holding(products, tiles, max_rows))


def _holding(products: Sequence[Product], tiles: Sequence[int], max_rows: int | None):
    max_rows = max_rows or max(64, 4 * max(tiles))
    gen = torch.Generator().manual_seed(0)
    with slot_attention.using_layout(slot_attention.RowLayout([], [], RowPadding(multiple=False))):  # (PackedLinear's canonical path)
        checks = []
        for columns, like, product in products:
            rows = torch.randn(max_rows, columns, generator=gen).to(like.device, like.dtype)
            full = product(rows)
            if not torch.equal(product(rows.flip(0)).flip(0), full):
                return
            checks.append((rows, product, full))
        for padding in (RowPadding(multiple, tile) for tile in tiles for multiple in (False, True)):
            counts = sorted({padding(m) for m in _COUNTS if m < max_rows} - {max_rows})
            if all(torch.equal(product(rows[:m]), full[:m]) for rows, product, full in checks for m in counts):
                yield padding


def fixed_shape_holds(products: Sequence[Product], rows: int) -> bool:
    """Whether, at exactly ``rows`` rows, each product's first rows keep their bits whatever the other rows
    hold (other random rows, zeros) and wherever they sit: invariance if every forward ran that one shape."""
    gen = torch.Generator().manual_seed(rows)
    part = max(rows // 4, 1)
    with slot_attention.using_layout(slot_attention.RowLayout([], [], RowPadding(multiple=False))):
        for columns, like, run in products:
            x = torch.randn(rows, columns, generator=gen).to(like.device, like.dtype)
            first = run(x)[:part]
            others = torch.randn(rows, columns, generator=gen).to(like.device, like.dtype)
            others[:part] = x[:part]
            zeros = torch.zeros_like(x)
            zeros[:part] = x[:part]
            moved = torch.cat([x[part:], x[:part]])  # the same rows at the end
            if not (torch.equal(run(others)[:part], first) and torch.equal(run(zeros)[:part], first)
                    and torch.equal(run(moved)[rows - part:], first)):
                return False
    return True


def fixed_shape_padding(products: Sequence[Product], shapes: Sequence[int] = FIXED_SHAPES) -> RowPadding | None:
    """The first of ``shapes`` at which ``products`` hold (``fixed_shape_holds``), as a fixed padding; else None."""
    return next((RowPadding(multiple=False, tile=rows, fixed=True) for rows in shapes
                 if fixed_shape_holds(products, rows)), None)


class NotRowInvariant(ValueError):
    """Canonical shapes asked of a device whose products no row padding makes batch-invariant."""
