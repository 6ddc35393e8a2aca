"""Random-weight targets of real models' shapes, built on the device, and a forward's time by rows.

The GPU check (``sim.bench.gpu_check``) cannot download a model, and an 8B one does not travel: it
builds Llama-shaped models with random weights where they run (``build_engine``: transformers'
``LlamaForCausalLM`` made directly on the device in the check's dtype, served by the product's own
``cloud.engine.TargetEngine``). Random weights cost what trained ones do: a forward's time depends on
the shapes, not the values.

``forward_ms`` times one forward that appends ``rows`` tokens to each of some sessions (each with a
context already in its KV slot), cropped back after each repeat, synchronized with the device: a
verify step as the verifier runs it, the engine's Python and launches included.

Contract. ``Shape`` names a model's dimensions; ``LLAMA_8B``, ``LLAMA_70B`` are Llama 3.1's, ``DRY_8B``,
``DRY_70B`` the CPU dry run's stand-ins (same code, tiny dimensions). Nothing here prints.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

__all__ = ["Shape", "LLAMA_8B", "LLAMA_70B", "DRY_8B", "DRY_70B", "build_engine", "device_sync", "forward_ms",
           "new_sessions", "layers_in_use", "release_memory"]


@dataclass(frozen=True)
class Shape:
    """A Llama-architecture model's dimensions (grouped-query attention, head dim ``hidden / heads``)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int

    def config(self, layers: int | None = None):
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
            num_hidden_layers=layers or self.layers, num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads, max_position_embeddings=8192, rope_theta=500000.0,
            tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)

    @property
    def params_per_layer(self) -> int:
        head_dim = self.hidden // self.heads
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_heads * head_dim
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.params_per_layer + 2 * self.vocab * self.hidden + self.hidden


LLAMA_8B = Shape("Llama-3.1-8B", 32, 4096, 32, 8, 14336, 128256)
LLAMA_70B = Shape("Llama-3.1-70B", 80, 8192, 64, 8, 28672, 128256)
DRY_8B = Shape("dry run: Llama-3.1-8B's layout at tiny size", 4, 64, 4, 2, 128, 512)
DRY_70B = Shape("dry run: Llama-3.1-70B's layout at tiny size", 8, 128, 8, 2, 256, 512)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def build_engine(shape: Shape, *, device: str, dtype: torch.dtype, shapes: str, layers: int | None = None, seed: int = 0):
    """A ``TargetEngine`` over ``shape`` (its first ``layers`` layers) with random weights made on
    ``device`` in ``dtype``; ``shapes`` as the engine takes it."""
    from transformers import LlamaForCausalLM

    from cloud.engine import TargetEngine

    torch.manual_seed(seed)
    with torch.device(device), _default_dtype(dtype):
        model = LlamaForCausalLM(shape.config(layers))
    return TargetEngine.from_model(model, name=f"{shape.name} (random weights, {model.config.num_hidden_layers} layers)",
                                   shapes=shapes)


@contextlib.contextmanager
def layers_in_use(engine, layers: int):
    """Forwards inside run the model's first ``layers`` layers only (transformers' Llama runs
    ``config.num_hidden_layers`` of its layers): a slice of a model, its cost per layer by difference."""
    config = engine.model.config
    before = config.num_hidden_layers
    config.num_hidden_layers = layers
    try:
        yield
    finally:
        config.num_hidden_layers = before


def release_memory(device: str) -> None:
    """Give what dropped engines held back to the device (between sections that build big models)."""
    import gc

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def device_sync(device: torch.device) -> Callable[[], None]:
    """Waits for the device's queued work (nothing to wait for on a CPU)."""
    if device.type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def _tokens(rng: random.Random, engine, n: int) -> list[int]:
    return [rng.randrange(3, min(engine.vocab_size, 20_000)) for _ in range(n)]


def new_sessions(engine, count: int, context: int, seed: int = 0) -> list:
    """``count`` sequences, each holding ``context`` random tokens (prefilled one sequence a forward)."""
    rng = random.Random(seed)
    seqs = []
    for _ in range(count):
        seq = engine.new_sequence()
        engine.forward(seq, _tokens(rng, engine, context), last_only=True)
        seqs.append(seq)
    device_sync(engine.device)()
    return seqs


def forward_ms(engine, seqs: Sequence, rows: int, *, reproducible: bool, repeats: int, warm_up: int = 2,
               logits: str = "all") -> dict:
    """One forward appending ``rows`` tokens to each of ``seqs`` (every row's logits, as a verify step
    asks; ``logits="last"``: a prefill's), cropped back after each: {median, min, max} ms over
    ``repeats`` after ``warm_up``."""
    from cloud.engine import ForwardItem

    rng = random.Random(rows)
    blocks = [_tokens(rng, engine, rows) for _ in seqs]
    lengths = [seq.length for seq in seqs]
    sync = device_sync(engine.device)
    times = []
    for i in range(warm_up + repeats):
        sync()
        started = time.perf_counter()
        engine.forward_batch([ForwardItem(seq, block, logits, reproducible=reproducible) for seq, block in zip(seqs, blocks)])
        sync()
        if i >= warm_up:
            times.append(1e3 * (time.perf_counter() - started))
        for seq, length in zip(seqs, lengths):
            engine.crop(seq, length)
    return {"median": round(statistics.median(times), 3), "min": round(min(times), 3), "max": round(max(times), 3)}
