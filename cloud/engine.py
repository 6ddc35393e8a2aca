"""The target model: transformers + torch, many sequences in one forward.

The engine knows nothing about tokenization, sampling or sessions: it feeds
token ids into sequences' KV slots and returns float32 logits. One forward
(``forward_batch``) packs the rows of any number of sequences, each at its own
position; a sequence's slot always holds exactly ``length`` tokens, and
``crop`` sets the length back after a verification rejected part of a block.

In canonical mode (the default) a row's logits are bit-identical however the
rows are packed: alone or beside any batch-mates, one token at a time or as
row j of a block (``cloud.slot_attention`` says how). So greedy and coupled
output equals target-only decoding token for token at any batch composition.

A forward item may carry hedge *branches*: rows that continue the sequence's
first ``position`` tokens with tokens of their own instead of the item's
(a tree, verified in the same forward). Their logits equal those of the same
tokens decoded on that path alone; their keys and values are kept aside, and
``adopt_branch`` puts a taken branch's into the slot.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Literal

import torch

from cloud import slot_attention
from cloud.device import pick_device, torch_threads
from cloud.invariance.free_products import PRIOR, choose
from cloud.invariance.padding import RowPaddedHead, RowPadding
from cloud.invariance.probe import (
    NotRowInvariant,
    Product,
    attention_products,
    fixed_shape_padding,
    invariant_row_padding,
    linear_products,
    row_tiles_for,
)
from cloud.invariance.products import PackedLinear, pack_linears, unpack_linears
from cloud.slot_attention import RowLayout, SlotKV
from shared.vocab import vocab_fingerprint

__all__ = ["TargetEngine", "NotRowInvariant", "CachedSequence", "ForwardItem", "Steps", "check_forward_items", "run_alone",
           "invariant_row_padding", "torch_threads"]

log = logging.getLogger(__name__)


@dataclass
class CachedSequence:
    """One sequence's KV slot, how many tokens it holds, and the forwards it took part in."""

    slot: SlotKV = field(default_factory=SlotKV)
    length: int = 0  # tokens in the slot
    shard_id: int = 0  # its name on the other ranks (tensor parallelism)
    forwards: int = 0  # forwards that carried rows of this sequence
    forward_s: float = 0.0  # wall time of those forwards
    branch_kv: dict[int, SlotKV] = field(default_factory=dict)  # the last forward's branches, by position


@dataclass(frozen=True)
class ForwardItem:
    """Rows for one sequence in a packed forward: ``tokens`` appended at its length; ``logits``
    says which rows' logits to return: "all", "last" or "none" (a prefill chunk before the last).

    ``branches``: (position, tokens) pairs, each continuing the sequence's first ``position``
    tokens (its cache and this item's rows) with ``tokens``; at distinct positions, each at most
    the end of this item's rows. Their logits follow the item's rows ("all" only); the slot keeps
    the item's rows, and ``seq.branch_kv[position]`` each branch's keys and values.
    """

    seq: CachedSequence
    tokens: Sequence[int]
    logits: Literal["all", "last", "none"] = "all"
    branches: Sequence[tuple[int, Sequence[int]]] = ()
    reproducible: bool = False  # its logits must not depend on its batch-mates (canonical shapes for the forward)

    @property
    def rows(self) -> int:
        return len(self.tokens) + sum(len(tokens) for _, tokens in self.branches)


Steps = Generator[ForwardItem, "torch.Tensor | None", object]
"""Work that needs forwards: yields one ``ForwardItem`` at a time, is sent its logits, returns a result."""


def check_forward_items(items: Sequence[ForwardItem]) -> None:
    """``ValueError`` unless ``items`` make one forward: each sequence once, each with tokens, and
    branches only with logits="all", at distinct positions within their item, each with tokens."""
    if len({id(item.seq) for item in items}) != len(items):
        raise ValueError("a sequence can appear only once in a forward")
    if any(not item.tokens for item in items):
        raise ValueError("forward needs at least one token per sequence")
    for item in items:
        end = item.seq.length + len(item.tokens)
        positions_used = [position for position, _ in item.branches]
        if item.branches and (item.logits != "all" or len(set(positions_used)) != len(positions_used)
                              or any(not 0 <= p <= end or not t for p, t in item.branches)):
            raise ValueError("branches need logits='all', distinct positions within the item, and tokens")


def run_alone(steps: Steps, engine: TargetEngine):
    """Run ``steps`` with one forward per item (no batch-mates); its return value."""
    try:
        item = next(steps)
        while True:
            item = steps.send(engine.forward_batch([item])[0])
    except StopIteration as done:
        return done.value


SHAPES = ("auto", "canonical", "free")  # every forward padded by need, always, or never
def kv_bytes_per_position(config, dtype: torch.dtype) -> int:
    """The KV cache's bytes for one position of a session: keys and values, every layer and KV head."""
    config = getattr(config, "text_config", config)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


class TargetEngine:
    """Loads a Hugging Face folder (or a GGUF file, dequantized by transformers).

    float32 on CPU; bfloat16 on GPU unless ``dtype`` says otherwise.
    ``shapes``: "canonical" pads every forward to batch-invariant shapes (see the module docstring);
    "free" runs each sequence's attention over exactly its keys and one-row products unpadded
    (faster alone, not invariant); "auto" pads a forward only when one of its items is
    ``reproducible`` (a lone session that is not runs at full speed). ``tensor_parallel``:
    load this rank's shard of a target split across that many ranks started
    by torchrun; the engine itself runs its calls on its shard alone
    (``cloud.tensor_parallel.ShardedEngine`` leads the other ranks).
    """

    verifies_branches: bool = True  # forwards may carry hedge branches (``ForwardItem.branches``)

    def __init__(
        self, model_path: str | Path, *, device: str | None = None, dtype: str | None = None, shapes: str = "canonical",
        tensor_parallel: int = 1,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # our own log line says what loaded and how fast

        path = Path(model_path)
        if not path.exists():
            raise FileNotFoundError(f"target model not found: {path}")
        self.device = pick_device(device)
        self.dtype = getattr(torch, dtype) if dtype else (torch.float32 if self.device.type == "cpu" else torch.bfloat16)
        if shapes not in SHAPES:
            raise ValueError(f"shapes must be one of {', '.join(SHAPES)}, not {shapes!r}")
        self.shapes = shapes
        started = time.perf_counter()
        kwargs: dict = {"dtype": self.dtype}
        if path.is_file():  # a GGUF file
            kwargs["gguf_file"] = path.name
            folder = str(path.parent)
        else:
            folder = str(path)
        if tensor_parallel > 1:
            from transformers.distributed import DistributedConfig

            kwargs["distributed_config"] = DistributedConfig(tp_size=tensor_parallel)
        model = AutoModelForCausalLM.from_pretrained(folder, **kwargs).to(self.device).eval()
        tokenizer = AutoTokenizer.from_pretrained(folder, **({"gguf_file": path.name} if path.is_file() else {}))
        self._adopt(model, tokenizer, path.name, started, tensor_parallel)
        log.debug("target weights fingerprint %s", self.weights_fingerprint.hex())  # (hashed at load, not on an Open)

    @classmethod
    def from_model(cls, model, tokenizer=None, *, name: str, shapes: str = "canonical") -> TargetEngine:
        """An engine over a model already built on its device (random weights of a real model's shapes, say:
        the GPU check builds them there, no download). ``tokenizer`` None: placeholder pieces, and the
        end-of-sequence ids the config names."""
        if shapes not in SHAPES:
            raise ValueError(f"shapes must be one of {', '.join(SHAPES)}, not {shapes!r}")
        engine = cls.__new__(cls)
        weight = next(model.parameters())
        engine.device, engine.dtype, engine.shapes = weight.device, weight.dtype, shapes
        engine._adopt(model.eval(), tokenizer, name, time.perf_counter(), 1)
        return engine

    def _adopt(self, model, tokenizer, name: str, started: float, tensor_parallel: int) -> None:
        """Serve ``model`` (on ``self.device``) in ``self.shapes``: slot attention, the invariance probes, the
        products' paths, the vocabulary."""
        canonical = self.shapes != "free"
        slot_attention.register()
        self.model = model
        self.model.config._attn_implementation = slot_attention.ATTENTION_NAME
        self.tokenizer = tokenizer
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        # Positions the model was trained for (None when the config does not say).
        self.max_positions: int | None = getattr(self.model.config, "max_position_embeddings", None)
        self.padding: RowPadding | None = None  # canonical shapes' rows (the linear layers' products)
        self.attention_padding: RowPadding | None = None  # canonical attention's products, when not ``padding``
        self.threads: int | None = None  # the products' thread count, where invariance needs one of its own
        # The linear layers: "onednn", packed (``cloud.invariance.products``: canonical products on rowdot or
        # oneDNN, free ones on the path measured fastest), or "blas" (F.linear).
        self.products = "onednn" if self.device.type == "cpu" and pack_linears(self.model) else "blas"
        if canonical and self.products == "onednn":
            self.padding = invariant_row_padding(linear_products(self.model), self.row_tiles)
            self.attention_padding, self.threads = self._invariant(attention_products(self.model))
            if self.padding is None or self.attention_padding is None:  # canonical shapes try F.linear instead
                self.padding = self.attention_padding = self.threads = None
                unpack_linears(self.model)
                self.products = "blas"
        if canonical and self.padding is None:
            self.padding, self.threads = self._invariant(linear_products(self.model))
        if canonical and self.padding is None and self.device.type != "cpu":
            # An accelerator whose products change with the row count at every tile: one fixed forward shape
            # may still hold (free below its ridge), with attention at a tile of its own.
            attention = invariant_row_padding(attention_products(self.model), self.row_tiles)
            fixed = fixed_shape_padding(linear_products(self.model)) if attention is not None else None
            if fixed is not None:
                self.padding, self.attention_padding = fixed, attention
        self.invariant = self.padding is not None
        if canonical and self.padding is None:
            if self.shapes == "canonical":  # every forward is promised batch-invariant logits: refuse, do not pretend
                raise NotRowInvariant(
                    f"canonical shapes refused: this device's matrix products are not row-invariant under any row "
                    f"padding tried (at least or a multiple of {', '.join(map(str, self.row_tiles))} rows"
                    f"{', and on one thread' if self.device.type == 'cpu' else ', nor at a fixed shape'}), so a "
                    "session's logits would "
                    "depend on its batch-mates; use --shapes auto (reproducible sessions are then refused) or free")
            log.warning("this device's matrix products are not row-invariant under any padding tried: reproducible "
                        "sessions are refused; the others' batched logits may differ in the last bits from alone")
            self.padding = RowPadding(multiple=True)  # still the likeliest to agree
        # Free shapes' path by weight shape and row count, measured on this machine (``cloud.invariance.free_products``).
        self.free_products = PRIOR
        if self.products == "onednn" and self.shapes != "canonical":
            packed = [m for m in self.model.modules() if isinstance(m, PackedLinear)]
            self.free_products = choose(packed)
            for module in packed:
                module.free = self.free_products
            log.info("free shapes' products: %s", self.free_products.describe())
        self.head = RowPaddedHead(self.model.get_output_embeddings())
        self.logit_softcap: float | None = getattr(self.model.config, "final_logit_softcapping", None)
        self.model_name = name
        self.eos_token_ids = self._eos_ids()
        self.pieces = self._pieces()
        self.fingerprint = vocab_fingerprint(self.pieces)
        self.load_s = time.perf_counter() - started
        log.info(
            "target %s loaded in %.1fs on %s/%s (vocab %d, %s shapes%s)",
            name, self.load_s, self.device, str(self.dtype).removeprefix("torch."), self.vocab_size,
            "free" if not canonical else (f"batch-invariant ({self.canonical_paths()} products, {self.padding})"
                                          if self.invariant
                                          else "canonical but NOT row-invariant")
            + (" for reproducible sessions, free for the others" if self.shapes == "auto" else ""),
            (" on one thread: this CPU's products split between threads by row count" if self.threads else "")
            + (f", tensor parallel over {tensor_parallel} ranks" if tensor_parallel > 1 else ""),
        )

    def canonical_paths(self) -> str:
        """The paths canonical shapes' linear products run on (``PackedLinear.canonical``), else ``products``."""
        paths = sorted({m.canonical for m in self.model.modules() if isinstance(m, PackedLinear)})
        return " and ".join(paths) if self.products == "onednn" and paths else self.products

    def _invariant(self, products: list[Product]) -> tuple[RowPadding | None, int | None]:
        """``products``' invariant padding, and the thread count it needs (None: any)."""
        padding = invariant_row_padding(products, self.row_tiles)
        if padding is None and self.device.type == "cpu" and torch.get_num_threads() > 1:
            # Some CPUs (an Intel Xeon with AVX-512, measured) split a BLAS product between threads by its
            # row count at every padding tried, but are row-invariant on one thread.
            with torch_threads(1):
                padding = invariant_row_padding(products, self.row_tiles)
            return padding, 1 if padding is not None else None
        return padding, None

    @property
    def max_forward_rows(self) -> int | None:
        """The most rows one forward may hold: a fixed canonical shape's (``RowPadding.fixed``); None: any."""
        return self.padding.tile if self.padding is not None and self.padding.fixed else None

    @property
    def row_tiles(self) -> tuple[int, ...]:
        """The row tiles canonical shapes may pad to on this device (``cloud.invariance.probe.row_tiles_for``)."""
        return row_tiles_for(self.device)

    @property
    def kv_bytes_per_position(self) -> int:
        """What one position of a session's KV cache holds, in bytes (``kv_bytes_per_position``)."""
        return kv_bytes_per_position(self.model.config, self.dtype)

    @cached_property
    def weights_fingerprint(self) -> bytes:
        """16 bytes of BLAKE2b over the target's parameters and buffers, by name, as they run (dtype and
        values; with tensor parallelism, this rank's shards): what ``Opened.target_fingerprint`` says."""
        digest = hashlib.blake2b(digest_size=16)
        for name, tensor in sorted(self.model.state_dict().items()):
            local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
            data = local.detach().to("cpu").contiguous()
            digest.update(f"{name}:{data.dtype}:{tuple(data.shape)};".encode())
            digest.update(data.view(torch.uint8).numpy() if data.numel() else b"")
        return digest.digest()

    def _eos_ids(self) -> set[int]:
        eos = self.model.generation_config.eos_token_id if self.model.generation_config else None
        if eos is None:
            eos = self.model.config.eos_token_id
        if eos is None and self.tokenizer is not None:
            eos = self.tokenizer.eos_token_id
        return set(eos) if isinstance(eos, (list, tuple, set)) else ({int(eos)} if eos is not None else set())

    def _pieces(self) -> list[str]:
        if self.tokenizer is None:
            return [f"<pad_{i}>" for i in range(self.vocab_size)]
        pieces = self.tokenizer.convert_ids_to_tokens(list(range(min(len(self.tokenizer), self.vocab_size))))
        # Embedding rows past the tokenizer (padding) get a stable placeholder.
        return [p if p is not None else "" for p in pieces] + [f"<pad_{i}>" for i in range(len(pieces), self.vocab_size)]

    @property
    def serves_reproducible(self) -> bool:
        """Whether a reproducible session's logits can be made bit-identical whatever its batch-mates."""
        return self.shapes != "free" and self.invariant

    def pads(self, reproducible: bool) -> bool:
        """Whether a forward holding only sessions like this (``reproducible`` or not) runs canonical shapes."""
        return self.padding is not None and (self.shapes == "canonical" or reproducible)

    def padding_for(self, items: Sequence[ForwardItem]) -> RowPadding | None:
        """The row padding of a forward over ``items``: canonical shapes when any of them is reproducible
        (or the engine always pads), else none."""
        return self.padding if self.pads(any(item.reproducible for item in items)) else None

    def rows_at_cost_of(self, rows: int, reproducible: bool = False) -> int | None:
        """The most rows a forward may hold for about the cost of ``rows``: on a CPU, the rows its
        products are padded to anyway; None on an accelerator, whose decode forwards are
        memory-bound (a few rows more cost next to nothing)."""
        if self.device.type != "cpu":
            return None
        return self.head.padded_rows(rows, self.padding if self.pads(reproducible) else None)

    def row_tile(self, reproducible: bool = False) -> int:
        """What ``Opened.row_tile`` says: the rows a forward costs alike to one (``rows_at_cost_of(1)``),
        0 on an accelerator (not said)."""
        return self.rows_at_cost_of(1, reproducible) or 0

    def new_sequence(self) -> CachedSequence:
        return CachedSequence()

    def close(self) -> None:
        """Release what the engine holds beyond its memory (nothing here; the follower ranks of a sharded one)."""

    def forward(self, seq: CachedSequence, tokens: list[int], *, last_only: bool = False) -> torch.Tensor:
        """Append ``tokens`` to one sequence; return their next-token logits [n, V] float32
        (``last_only``: the last token's only, [1, V]: a prefill never holds n x V floats)."""
        return self.forward_batch([ForwardItem(seq, tokens, "last" if last_only else "all")])[0]

    @torch.inference_mode()
    def forward_batch(self, items: Sequence[ForwardItem]) -> list[torch.Tensor | None]:
        """One forward for every item's rows; per item, the logits its ``logits`` asks for
        ([n, V] or [1, V] float32; None for "none"). Each sequence may appear once."""
        if not items:
            return []
        check_forward_items(items)
        started = time.perf_counter()
        tokens: list[int] = []
        positions: list[int] = []
        spans: list[tuple[int, int, int]] = []
        slots: list[SlotKV] = []
        branch_stores: list[SlotKV | None] = []  # per span: where a branch's keys and values go
        keep: list[int] = []  # packed rows whose logits are returned
        for item in items:
            item.seq.branch_kv = {}
            rows = [(item.seq.length, item.tokens, None)]
            for position, branch in item.branches:
                item.seq.branch_kv[position] = SlotKV()
                rows.append((position, branch, item.seq.branch_kv[position]))
            for start, row_tokens, store in rows:  # the item's own rows first, then its branches
                n, first = len(row_tokens), len(tokens)
                spans.append((first, n, start))
                slots.append(item.seq.slot)
                branch_stores.append(store)
                tokens.extend(int(t) for t in row_tokens)
                positions.extend(range(start, start + n))
                keep.extend(range(first, first + n) if item.logits == "all" else [first + n - 1] if item.logits == "last" else [])
        real, padding = len(tokens), self.padding_for(items)
        if padding is not None and padding(real) != real:  # padding rows: no slot, position 0, dropped
            tokens += [0] * (padding(real) - real)
            positions += [0] * (padding(real) - real)
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        position_ids = torch.tensor([positions], dtype=torch.long, device=self.device)
        layout = RowLayout(slots, spans, padding, self.attention_padding if padding else None, branch_stores=branch_stores)
        # A 4-D mask is taken as given by transformers' mask builders; slot attention ignores it.
        dummy_mask = torch.zeros(1, 1, 1, 1, dtype=self.dtype, device=self.device)
        logits = None
        with slot_attention.using_layout(layout), torch_threads(self.threads if padding is not None else None):
            hidden = self.model.get_decoder()(
                input_ids=ids, position_ids=position_ids, attention_mask=dummy_mask, use_cache=False
            ).last_hidden_state
            if keep:
                logits = self.head(hidden[:, keep], padding)[0]
        if logits is not None:
            if self.logit_softcap:
                logits = torch.tanh(logits / self.logit_softcap) * self.logit_softcap
            logits = logits.float()
        elapsed = time.perf_counter() - started
        out: list[torch.Tensor | None] = []
        offset = 0
        for item in items:
            count = item.rows if item.logits == "all" else 1 if item.logits == "last" else 0
            out.append(logits[offset : offset + count] if count else None)
            offset += count
            item.seq.length += len(item.tokens)
            item.seq.forwards += 1
            item.seq.forward_s += elapsed
        return out

    def crop(self, seq: CachedSequence, length: int) -> None:
        """Keep the first ``length`` tokens of the slot (what lies past them is overwritten later)."""
        if not 0 <= length <= seq.length:
            raise ValueError(f"cannot crop a {seq.length}-token cache to {length}")
        seq.length = length
        seq.branch_kv = {}

    @torch.inference_mode()
    def adopt_branch(self, seq: CachedSequence, position: int, count: int) -> None:
        """Make the first ``count`` tokens of the last forward's branch at ``position`` the slot's
        positions ``position ..``; the sequence then holds ``position + count`` tokens."""
        store = seq.branch_kv.get(position)
        if store is None or not 0 <= position <= seq.length or count < 0 or (
                count and (not store.keys or store.keys[0].shape[1] < count)):
            raise ValueError(f"no branch of {count} tokens at position {position} to adopt")
        for layer, (keys, values) in enumerate(zip(store.keys, store.values)):
            seq.slot.reserve(layer, keys, position + count)
            seq.slot.keys[layer][:, position : position + count] = keys[:, :count]
            seq.slot.values[layer][:, position : position + count] = values[:, :count]
        seq.length = position + count
        seq.branch_kv = {}
