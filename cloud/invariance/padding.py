"""Canonical shapes' padding: products on a row tile, keys in buckets, the output head padded alike.

``RowPadding`` says how many rows a product of m rows runs on in canonical
shapes (at least a tile, or a multiple of it with several threads); ``bucket``
how many keys a row attends over (a multiple of ``KEY_BUCKET``, fixed by its
own position); ``RowPaddedHead`` pads the output projection's rows so. Which
tile holds on this device is ``cloud.invariance.probe``'s question.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["KEY_BUCKET", "ROW_TILE", "RowPadding", "RowPaddedHead", "bucket", "pad_rows"]

KEY_BUCKET = 64  # keys a row attends over are padded to a multiple of this
ROW_TILE = 4  # products run on at least (or a multiple of) this many rows, or a tile the CPU needs (``RowPadding``)


@dataclass(frozen=True)
class RowPadding:
    """How many rows a product of ``rows`` runs on in canonical mode: at least ``tile``, and a
    multiple of it when ``multiple`` (several threads split products by rows); exactly ``tile`` when
    ``fixed`` (a GPU whose kernels change with the row count at every tile: one shape holds, so a
    canonical forward may hold no more than ``tile`` rows, ``ValueError`` past it)."""

    multiple: bool
    tile: int = ROW_TILE
    fixed: bool = False

    def __call__(self, rows: int) -> int:
        if self.fixed:
            if rows > self.tile:
                raise ValueError(f"a canonical forward of {rows} rows: this device's products keep a row's bits "
                                 f"only at one shape, {self.tile} rows")
            return self.tile
        if self.multiple:
            return max(-(-rows // self.tile), 1) * self.tile
        return max(rows, self.tile)


def bucket(n: int) -> int:
    return -(-n // KEY_BUCKET) * KEY_BUCKET


def pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x`` [..., m, d] with zero rows appended up to ``rows``."""
    missing = rows - x.shape[-2]
    return x if missing <= 0 else torch.cat([x, x.new_zeros(*x.shape[:-2], missing, x.shape[-1])], dim=-2)


class RowPaddedHead(torch.nn.Module):
    """The output projection, its rows padded as canonical shapes need (``cloud.slot_attention``).

    CPU BLAS takes other kernels for 1-3 row products: measured here on
    Gemma's 262144 x 640 head (one thread), 1 row 44 ms, 2 rows 91 ms,
    3 rows 137 ms, 4 rows 77 ms. Products of 2-3 rows are padded to 4 zero
    rows (faster) unless the head is a ``PackedLinear``, whose free-shape path
    per row count was measured on this machine (``cloud.invariance.free_products``);
    in canonical mode every product is padded as ``padding``
    says (bit-identical to the same row in any bigger batch, see
    ``cloud.slot_attention``). The padding's outputs are dropped.
    """

    def __init__(self, head: torch.nn.Module) -> None:
        super().__init__()
        self.head = head

    @property
    def weight(self) -> torch.Tensor:
        return self.head.weight

    def padded_rows(self, rows: int, padding: RowPadding | None = None) -> int:
        """The rows a product of ``rows`` rows runs on (``padding``: canonical shapes'; None: free)."""
        if padding:
            return padding(rows)
        if hasattr(self.head, "path_at"):  # a measured choice of path per row count: no padding beats it
            return rows
        return ROW_TILE if 1 < rows < ROW_TILE else rows

    def forward(self, hidden: torch.Tensor, padding: RowPadding | None = None) -> torch.Tensor:
        rows = hidden.shape[-2]
        padded = self.padded_rows(rows, padding)
        if padded == rows:
            return self.head(hidden)
        pad = hidden.new_zeros(*hidden.shape[:-2], padded - rows, hidden.shape[-1])
        return self.head(torch.cat([hidden, pad], dim=-2))[..., :rows, :]
