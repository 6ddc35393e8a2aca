"""Batch invariance, one room: a reproducible row's logits are the same bits whatever its batch-mates.

- ``padding``: canonical shapes (products on a row tile, keys in buckets, the
  output head padded alike);
- ``products``: the product path that holds at the smallest tile (oneDNN's
  inner product on a packed weight, where BLAS needs a bigger one);
- ``probe``: which padding holds on this device, checked at load with
  ``torch.equal`` (the gate: no padding found, no canonical shapes).
The attention that runs canonical shapes is ``cloud.slot_attention``. Why and
what it costs: ``docs/batching.md``.
"""
