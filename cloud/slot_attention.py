"""Attention over per-sequence KV slots, for a forward that packs many sequences' rows.

The engine packs the rows of several sequences (each at its own position)
into one batch-1 sequence, so every linear layer runs once for all of them;
this module is the attention that the packing needs. It is registered with
transformers' ``AttentionInterface`` as ``"splitspec_slots"`` and reads the
packing from ``RowLayout`` (set by the engine around each forward). For each
sequence it writes the new keys and values into that sequence's slot, then
attends every row to its own slot's keys only.

Batch invariance. In canonical mode a row's output depends only on its own
token, position and the keys before it, never on how rows are grouped:

- the keys a row sees are its slot's first ``bucket(position + 1)`` entries
  (multiples of ``KEY_BUCKET``), fixed by the row's own position; later
  entries are masked, their weights are exactly 0, and 0 * v adds nothing;
- rows are grouped by bucket, and every product runs on rows padded as
  ``RowPadding`` says (zero rows appended): at least a tile of rows, and
  with several threads a multiple of it. On CPU (MKL) a GEMM's rows are then
  bit-identical for any such M and any row order, so a row's result does not
  depend on its group-mates; other M take other kernels (1-3 rows) or other
  splits between threads (5 and 9 rows with two threads, measured). The tile
  is the CPU's and the product path's: for MKL 4 rows on an AMD EPYC, 16 on
  an Intel Xeon with AVX-512, whose kernels differ below 16 rows (measured
  on Gemma's 640 x 2048 products, one thread); the linear layers run on
  rowdot or oneDNN where they hold at fewer (``cloud.invariance.products``: 2),
  and this module's own products then keep theirs
  (``RowLayout.attention_padding``). The engine picks the paddings by
  checking the property on its device at load
  (``cloud.invariance.probe.invariant_row_padding``).

Free mode (``canonical=False``) attends each sequence over exactly its keys
with SDPA: what the cost of invariance is measured against.

Hedge branches (a tree). A span may be a branch: rows continuing its slot's
first ``position`` entries with tokens of their own. Its keys and values are
written over the slot's entries at ``position ..`` (after the sequence's own
span has attended, in the same layer), its rows attend exactly as the same
tokens would on that path alone, and then the slot's entries are put back;
the branch's keys and values go to its store (``RowLayout.branch_stores``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from cloud.invariance.padding import KEY_BUCKET, ROW_TILE, RowPadding, bucket, pad_rows

__all__ = ["ATTENTION_NAME", "KEY_BUCKET", "ROW_TILE", "RowLayout", "RowPadding", "SlotKV", "current_layout", "register"]

ATTENTION_NAME = "splitspec_slots"

_local = threading.local()


class SlotKV:
    """One sequence's keys and values, per layer [kv_heads, capacity, head_dim]; grows by buckets."""

    def __init__(self, limit: int | None = None) -> None:
        self.keys: list[torch.Tensor | None] = []
        self.values: list[torch.Tensor | None] = []
        self.limit = limit  # positions the sequence may ever need (growth stops there; None: unbounded)

    def _reach(self, layer: int) -> None:
        while len(self.keys) <= layer:
            self.keys.append(None)
            self.values.append(None)

    def keep(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Copies of ``keys`` and ``values`` [kv_heads, n, head_dim] as ``layer``'s, exactly sized
        (a hedge branch's store)."""
        self._reach(layer)
        self.keys[layer], self.values[layer] = keys.clone(), values.clone()

    def reserve(self, layer: int, like: torch.Tensor, needed: int) -> None:
        """Room for ``needed`` positions in ``layer`` (``like``: [kv_heads, n, head_dim] new keys)."""
        self._reach(layer)
        current = self.keys[layer]
        if current is not None and current.shape[1] >= needed:
            return
        capacity = max(bucket(needed), 2 * (current.shape[1] if current is not None else 0))
        if self.limit is not None:  # doubling never allocates past what the sequence may need
            capacity = max(bucket(needed), min(capacity, bucket(self.limit)))
        keys = like.new_zeros(like.shape[0], capacity, like.shape[2])
        values = like.new_zeros(like.shape[0], capacity, like.shape[2])
        if current is not None:
            keys[:, : current.shape[1]] = current
            values[:, : current.shape[1]] = self.values[layer]
        self.keys[layer], self.values[layer] = keys, values


@dataclass(frozen=True)
class RowLayout:
    """Which rows of a packed forward belong to which slot: ``spans[i]`` = (first row, rows, first
    position) for ``slots[i]``; rows past the last span are padding (no slot, output zeros).
    ``padding``: canonical mode's row padding; None is free mode. ``attention_padding``: the
    attention products' own, where their product path needs another tile than the linear layers'
    (``cloud.invariance.products``)."""

    slots: list[SlotKV]
    spans: list[tuple[int, int, int]]
    padding: RowPadding | None = None
    attention_padding: RowPadding | None = None  # canonical attention's products, when not ``padding``
    masks: dict = field(default_factory=dict)  # attention masks, built once per forward
    branch_stores: list[SlotKV | None] | None = None  # per span: a branch's store (None: the slot's own rows)


def current_layout() -> RowLayout | None:
    return getattr(_local, "layout", None)


class using_layout:
    """Context manager: ``layout`` is what ``slot_attention`` reads on this thread."""

    def __init__(self, layout: RowLayout) -> None:
        self.layout = layout

    def __enter__(self) -> RowLayout:
        _local.layout = self.layout
        return self.layout

    def __exit__(self, *exc) -> None:
        _local.layout = None


def _mask(positions: torch.Tensor, length: int, window: int | None, padded_rows: int) -> torch.Tensor:
    """Which of ``length`` keys each row at ``positions`` [r] may see: causal, within the sliding
    window; padding rows up to ``padded_rows`` see key 0 (their output is dropped). [padded_rows, L]."""
    key_index = torch.arange(length, device=positions.device)
    allowed = key_index[None, :] <= positions[:, None]
    if window:
        allowed &= key_index[None, :] > positions[:, None] - window
    if padded_rows > positions.shape[0]:
        allowed = torch.cat([allowed, key_index[None, :].expand(padded_rows - positions.shape[0], length) == 0])
    return allowed


def _attend_canonical(q, keys, values, allowed, scaling, softcap):
    """Rows of one slot that share a key bucket: q [KV, r, d] ((head, query) pairs), keys and
    values [KV, L, d] (the bucket), ``allowed`` [r', L] from ``_mask``; returns [KV, r, d]."""
    rows = q.shape[1]
    q = pad_rows(q, allowed.shape[0])
    scores = torch.matmul(q, keys.transpose(-1, -2)) * scaling  # [KV, r', L]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, values)[:, :rows]


@dataclass(frozen=True)
class _HeadTerms:
    """What every span of a layer's attention shares: the score scale, the sliding window (None: full),
    the score soft-cap (None: none) and how many query heads share a KV head."""

    scaling: float
    window: int | None
    softcap: float | None
    rep: int


def slot_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The ``AttentionInterface`` function: query [1, H, M, d], key/value [1, KV, M, d] (rotary
    applied) for the packed rows; returns ([1, M, H, d], None). ``attention_mask`` is ignored:
    masks come from each row's position. The model passes ``sliding_window`` and ``softcap`` (where
    it has them) among ``kwargs``."""
    layout = current_layout()
    if layout is None:
        raise RuntimeError("slot attention runs only inside TargetEngine.forward_batch")
    layer = module.layer_idx
    _, heads, total, dim = query.shape
    kv_heads = key.shape[1]
    terms = _HeadTerms(module.head_dim ** -0.5 if scaling is None else scaling, kwargs.get("sliding_window") or None,
                       kwargs.get("softcap"), heads // kv_heads)
    out = query.new_zeros(total, heads, dim)
    stores = layout.branch_stores or [None] * len(layout.spans)
    for index, (slot, (first, rows, position), store) in enumerate(zip(layout.slots, layout.spans, stores)):
        k_new = key[0, :, first : first + rows]  # [KV, rows, d]
        v_new = value[0, :, first : first + rows]
        slot.reserve(layer, k_new, position + rows)
        if store is not None:  # a branch: keep its keys and values, and what it overwrites in the slot
            store.keep(layer, k_new, v_new)
            kept = (slot.keys[layer][:, position : position + rows].clone(),
                    slot.values[layer][:, position : position + rows].clone())
        slot.keys[layer][:, position : position + rows] = k_new
        slot.values[layer][:, position : position + rows] = v_new
        _attend_span(layout, index, slot, layer, query[0, :, first : first + rows], position, out[first : first + rows],
                     terms)
        if store is not None:
            slot.keys[layer][:, position : position + rows], slot.values[layer][:, position : position + rows] = kept
    return out[None], None


def _attend_span(layout: RowLayout, index: int, slot: SlotKV, layer: int, q: torch.Tensor, position: int,
                 out: torch.Tensor, terms: _HeadTerms) -> None:
    """Attend span ``index``'s rows ``q`` [H, rows, d] at positions ``position ..`` to its slot's
    keys; writes ``out`` [rows, H, d]."""
    scaling, window, softcap, rep = terms.scaling, terms.window, terms.softcap, terms.rep
    heads, rows, dim = q.shape
    kv_heads = heads // rep
    masks = layout.masks  # built by the first layer, reused by the others (same rows, same positions)
    positions = torch.arange(position, position + rows, device=q.device)
    if layout.padding is None and softcap is None:  # (soft-capped scores: the canonical path does them)
        end = position + rows
        allowed = masks.get((index, window))
        if allowed is None:
            allowed = masks[(index, window)] = _mask(positions, end, window, rows)
        result = F.scaled_dot_product_attention(
            q[None], slot.keys[layer][None, :, :end], slot.values[layer][None, :, :end],
            attn_mask=allowed, scale=scaling, enable_gqa=rep > 1,
        )[0]  # [H, rows, d]
        out[:] = result.transpose(0, 1)
        return
    # Canonical: group rows by their key bucket; fold the heads sharing a KV head into the rows.
    buckets = [bucket(int(p) + 1) for p in positions.tolist()]
    start = 0
    while start < rows:
        stop = start
        while stop < rows and buckets[stop] == buckets[start]:
            stop += 1
        length = buckets[start]
        g = stop - start
        q_group = q[:, start:stop].reshape(kv_heads, rep * g, dim)  # rows are (head, query) pairs
        allowed = masks.get((index, start, window))
        if allowed is None:
            padding = layout.attention_padding or layout.padding or RowPadding(multiple=False)
            allowed = masks[(index, start, window)] = _mask(positions[start:stop].repeat(rep), length, window,
                                                            padding(rep * g))
        result = _attend_canonical(
            q_group, slot.keys[layer][:, :length], slot.values[layer][:, :length], allowed, scaling, softcap,
        )  # [KV, rep*g, d]
        out[start:stop] = result.reshape(heads, g, dim).transpose(0, 1)
        start = stop


def register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, slot_attention)
