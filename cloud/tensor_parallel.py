"""Tensor parallelism: the target sharded across the ranks ``torchrun`` started; rank 0 leads.

``load_engine`` builds the engine for this process: a plain ``TargetEngine``
without torchrun; under it a ``ShardedEngine`` on rank 0 and a ``TargetEngine``
over its own shard on every other rank, which runs ``follow``. This module
extends ``cloud.engine``, which never imports it.

Launch: ``torchrun --nproc-per-node N -m cloud.cli serve ...``. Every rank loads
its shard (transformers' tensor-parallel plan, ``DistributedConfig(tp_size=N)``;
gloo on CPU, NCCL on GPUs). Rank 0 runs the gRPC service, the scheduler and the
sessions; before each engine call that touches the model or a KV slot (a packed
forward, a crop) it broadcasts the call, so the followers run the same forward
on their shards in the same order and the collectives inside it pair up.
Followers mirror rank 0's sequences by id; sequences rank 0 has dropped are
dropped with the next call. Attention is per head, so each rank's slots hold
its own heads' keys and values. Hedge branches are refused (the broadcast
does not carry them): a ``ShardedEngine`` does not verify branches.
"""

from __future__ import annotations

import itertools
import logging
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path

import torch.distributed as dist

from cloud.engine import CachedSequence, ForwardItem, TargetEngine, check_forward_items

__all__ = ["Leader", "ShardedEngine", "follow", "load_engine", "world_size", "rank"]

log = logging.getLogger(__name__)


def world_size() -> int:
    """How many ranks torchrun started (1 without torchrun)."""
    import os

    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    import os

    return int(os.environ.get("RANK", "0"))


class Leader:
    """Rank 0's side: numbers sequences and broadcasts engine calls to the followers."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._dropped: list[int] = []
        self._lock = threading.Lock()  # sequences may be collected on any thread

    def register(self, seq: CachedSequence) -> None:
        seq.shard_id = next(self._ids)
        weakref.finalize(seq, self._drop, seq.shard_id)

    def _drop(self, shard_id: int) -> None:
        with self._lock:
            self._dropped.append(shard_id)

    def forward(self, items: list[ForwardItem]) -> None:
        self._send(("forward", [(item.seq.shard_id, list(item.tokens), item.logits, item.reproducible)
                                for item in items]))

    def crop(self, seq: CachedSequence, length: int) -> None:
        self._send(("crop", seq.shard_id, length))

    def stop(self) -> None:
        try:
            self._send(("stop",))
        except RuntimeError as exc:  # a follower already went away
            log.warning("could not tell the follower ranks to stop: %s", exc)

    def _send(self, call: tuple) -> None:
        with self._lock:
            dropped, self._dropped = self._dropped, []
        dist.broadcast_object_list([(dropped, call)], src=0)


class ShardedEngine(TargetEngine):
    """Rank 0's engine: a ``TargetEngine`` over its shard that tells the followers each call that
    touches the model or a KV slot before it runs the call itself."""

    verifies_branches = False  # the broadcast carries no branches

    def __init__(self, model_path: str | Path, *, tensor_parallel: int, **kwargs) -> None:
        super().__init__(model_path, tensor_parallel=tensor_parallel, **kwargs)
        self._leader = Leader()
        self._stopped = False

    def new_sequence(self) -> CachedSequence:
        seq = super().new_sequence()
        self._leader.register(seq)
        return seq

    def close(self) -> None:
        """Release the follower ranks (once)."""
        if not self._stopped:
            self._stopped = True
            self._leader.stop()

    def forward_batch(self, items: Sequence[ForwardItem]) -> list:
        if items:  # checked before the followers hear of it: a bad call never leaves rank 0
            check_forward_items(items)
            if any(item.branches for item in items):
                raise ValueError("hedge branches are not supported with tensor parallelism")
            self._leader.forward(list(items))
        return super().forward_batch(items)

    def crop(self, seq: CachedSequence, length: int) -> None:
        if 0 <= length < seq.length:  # a cut (``TargetEngine.crop`` refuses a bad length)
            self._leader.crop(seq, length)
        super().crop(seq, length)


def load_engine(model_path: str | Path, **kwargs) -> TargetEngine:
    """The engine for this process (``kwargs``: ``TargetEngine``'s): sharded across torchrun's ranks
    when it started more than one, rank 0's leading (``ShardedEngine``) and the others' to be driven
    by ``follow``; else a plain ``TargetEngine``."""
    ranks = world_size()
    if ranks == 1:
        return TargetEngine(model_path, **kwargs)
    return (ShardedEngine if rank() == 0 else TargetEngine)(model_path, tensor_parallel=ranks, **kwargs)


def follow(engine: TargetEngine) -> None:
    """A follower rank's loop: run rank 0's calls on this rank's shard until it says stop (or is
    gone). SIGTERM and SIGINT are left to rank 0, which drains its calls and then says stop."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    sequences: dict[int, CachedSequence] = {}
    log.info("rank %d follows rank 0", dist.get_rank())
    while True:
        box: list = [None]
        try:
            dist.broadcast_object_list(box, src=0)
        except RuntimeError as exc:
            log.warning("rank 0 is gone (%s); this rank stops", exc)
            return
        dropped, call = box[0]
        for shard_id in dropped:
            sequences.pop(shard_id, None)
        if call[0] == "stop":
            return
        if call[0] == "forward":
            engine.forward_batch([ForwardItem(sequences.setdefault(shard_id, engine.new_sequence()), tokens, logits,
                                              reproducible=reproducible)
                                  for shard_id, tokens, logits, reproducible in call[1]])
        elif call[0] == "crop":
            engine.crop(sequences[call[1]], call[2])
