"""Tensor parallelism: the target sharded across the ranks ``torchrun`` started; rank 0 leads.

Launch: ``torchrun --nproc-per-node N -m cloud.cli serve ...``. Every rank loads
its shard (transformers' tensor-parallel plan, ``DistributedConfig(tp_size=N)``;
gloo on CPU, NCCL on GPUs). Rank 0 runs the gRPC service, the scheduler and the
sessions; before each engine call that touches the model or a KV slot (a packed
forward, a crop) it broadcasts the call, so the followers run the same forward
on their shards in the same order and the collectives inside it pair up.
Followers mirror rank 0's sequences by id; sequences rank 0 has dropped are
dropped with the next call. Attention is per head, so each rank's slots hold
its own heads' keys and values.
"""

from __future__ import annotations

import itertools
import logging
import threading
import weakref

import torch.distributed as dist

from cloud.engine import CachedSequence, ForwardItem, TargetEngine

__all__ = ["Leader", "follow", "world_size", "rank"]

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
        self._send(("forward", [(item.seq.shard_id, list(item.tokens), item.logits) for item in items]))

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
            engine.forward_batch([ForwardItem(sequences.setdefault(shard_id, engine.new_sequence()), tokens, logits)
                                  for shard_id, tokens, logits in call[1]])
        elif call[0] == "crop":
            engine.crop(sequences[call[1]], call[2])
