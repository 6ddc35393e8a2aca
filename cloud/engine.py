"""The target model: transformers + torch, one KV cache per sequence.

The engine knows nothing about tokenization, sampling or sessions: it feeds
token ids into a sequence's cache and returns float32 logits. A sequence's
cache always holds exactly ``length`` tokens; ``crop`` cuts it back after a
verification rejected part of a block.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from shared.vocab import vocab_fingerprint

__all__ = ["TargetEngine", "CachedSequence"]

log = logging.getLogger(__name__)


@dataclass
class CachedSequence:
    """One sequence's KV cache, how many tokens it holds, and the forwards run on it (counted here only)."""

    cache: object  # transformers DynamicCache
    length: int = 0  # tokens in the cache
    forwards: int = 0  # forward passes run on this sequence
    forward_s: float = field(default=0.0)  # time inside those forwards


class RowPaddedHead(torch.nn.Module):
    """The output projection, run on at least ``min_rows`` rows.

    CPU BLAS takes a slow path for 2-3 row products against a large weight:
    measured here on Gemma's 262144 x 640 head, 1 row 56 ms, 2 rows 126 ms,
    3 rows 191 ms, 4 rows 112 ms. Verify blocks of 2-3 tokens are padded
    with zero rows and the padding's outputs dropped; rows are independent,
    so the real rows' logits are what an unpadded product gives (up to
    kernel rounding, as between any two batch shapes).
    """

    def __init__(self, head: torch.nn.Module, min_rows: int = 4) -> None:
        super().__init__()
        self.head = head
        self.min_rows = min_rows

    @property
    def weight(self) -> torch.Tensor:
        return self.head.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        rows = hidden.shape[-2]
        if not 1 < rows < self.min_rows:
            return self.head(hidden)
        pad = hidden.new_zeros(*hidden.shape[:-2], self.min_rows - rows, hidden.shape[-1])
        return self.head(torch.cat([hidden, pad], dim=-2))[..., :rows, :]


def pick_device(device: str | None) -> torch.device:
    """``device`` as a torch device (None: cuda when present, else cpu); ``ValueError`` for a name
    torch does not know or an accelerator this machine lacks."""
    if not device:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"--device {device!r} is not a torch device (cpu, cuda, cuda:1, mps, ...)") from exc
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA device on this machine (use --device cpu)")
    if chosen.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"--device {device}: no MPS device on this machine (use --device cpu)")
    return chosen


class TargetEngine:
    """Loads a Hugging Face folder (or a GGUF file, dequantized by transformers).

    float32 on CPU; bfloat16 on GPU unless ``dtype`` says otherwise.
    """

    def __init__(self, model_path: str | Path, *, device: str | None = None, dtype: str | None = None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # our own log line says what loaded and how fast

        path = Path(model_path)
        if not path.exists():
            raise FileNotFoundError(f"target model not found: {path}")
        self.device = pick_device(device)
        self.dtype = getattr(torch, dtype) if dtype else (torch.float32 if self.device.type == "cpu" else torch.bfloat16)
        started = time.perf_counter()
        kwargs: dict = {"dtype": self.dtype}
        if path.is_file():  # a GGUF file
            kwargs["gguf_file"] = path.name
            folder = str(path.parent)
        else:
            folder = str(path)
        self.model = AutoModelForCausalLM.from_pretrained(folder, **kwargs).to(self.device).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(folder, **({"gguf_file": path.name} if path.is_file() else {}))
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        # Positions the model was trained for (None when the config does not say).
        self.max_positions: int | None = getattr(self.model.config, "max_position_embeddings", None)
        if self.device.type == "cpu":
            self.model.set_output_embeddings(RowPaddedHead(self.model.get_output_embeddings()))
        self.model_name = path.name
        self.eos_token_ids = self._eos_ids()
        self.pieces = self._pieces()
        self.fingerprint = vocab_fingerprint(self.pieces)
        self.load_s = time.perf_counter() - started
        log.info(
            "target %s loaded in %.1fs on %s/%s (vocab %d)",
            path.name, self.load_s, self.device, str(self.dtype).removeprefix("torch."), self.vocab_size,
        )

    def _eos_ids(self) -> set[int]:
        eos = self.model.generation_config.eos_token_id if self.model.generation_config else None
        if eos is None:
            eos = self.model.config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return set(eos) if isinstance(eos, (list, tuple, set)) else ({int(eos)} if eos is not None else set())

    def _pieces(self) -> list[str]:
        pieces = self.tokenizer.convert_ids_to_tokens(list(range(min(len(self.tokenizer), self.vocab_size))))
        # Embedding rows past the tokenizer (padding) get a stable placeholder.
        return [p if p is not None else "" for p in pieces] + [f"<pad_{i}>" for i in range(len(pieces), self.vocab_size)]

    def new_sequence(self) -> CachedSequence:
        from transformers import DynamicCache

        # A plain (non-sliding) cache: every layer keeps every token, so crop()
        # is exact; sliding-window layers still see the right window via masks.
        return CachedSequence(cache=DynamicCache())

    @torch.inference_mode()
    def forward(self, seq: CachedSequence, tokens: list[int], *, last_only: bool = False) -> torch.Tensor:
        """Append ``tokens`` to the sequence; return their next-token logits [n, V] float32
        (``last_only``: the last token's only, [1, V]: a prefill never holds n x V floats)."""
        if not tokens:
            raise ValueError("forward needs at least one token")
        started = time.perf_counter()
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        positions = torch.arange(seq.length, seq.length + len(tokens), device=self.device)
        out = self.model(
            input_ids=ids, cache=seq.cache, use_cache=True, position_ids=positions.unsqueeze(0),
            logits_to_keep=1 if last_only else 0,
        )
        seq.length += len(tokens)
        seq.forwards += 1
        logits = out.logits[0].float()
        seq.forward_s += time.perf_counter() - started
        return logits

    def crop(self, seq: CachedSequence, length: int) -> None:
        """Keep the first ``length`` tokens of the cache."""
        if not 0 <= length <= seq.length:
            raise ValueError(f"cannot crop a {seq.length}-token cache to {length}")
        if length < seq.length:
            seq.cache.crop(-(seq.length - length))  # transformers 5 takes the count to remove
            seq.length = length
