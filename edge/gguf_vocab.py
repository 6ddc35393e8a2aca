"""A GGUF model's vocabulary through llama.cpp: tokenize, detokenize, identity.

Works on a full drafter context or on a ``vocab_only`` load (the cloud-only
baseline client needs the tokenizer but not the weights).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path

from shared.vocab import vocab_fingerprint

__all__ = ["GgufVocab", "load_llama"]

_log_callback = None  # kept alive: llama.cpp holds a raw pointer to it
_DEFAULTS_LOCK = threading.Lock()  # ``load_llama`` swaps llama.cpp's context defaults while it loads


def load_llama(path: str | os.PathLike, sequences: int = 1, **kwargs):
    """``llama_cpp.Llama`` for ``path`` with llama.cpp's logs routed to Python logging (DEBUG); its context
    holds ``sequences`` KV sequences over one unified cache (``llama_context_params.n_seq_max``, which
    ``Llama`` does not take: its defaults are read with it set, under a lock)."""
    import logging

    import llama_cpp  # deferred: importing loads the native library

    global _log_callback
    if _log_callback is None:
        logger = logging.getLogger("llama.cpp")

        @llama_cpp.llama_log_callback
        def forward(level, text, user_data):
            logger.debug("%s", text.decode("utf-8", "replace").rstrip())

        _log_callback = forward
        llama_cpp.llama_log_set(_log_callback, None)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"drafter model not found: {path}")
    if sequences == 1:
        return llama_cpp.Llama(model_path=str(path), verbose=False, **kwargs)
    library = llama_cpp.llama_cpp
    defaults = library.llama_context_default_params

    def with_sequences():
        params = defaults()
        params.n_seq_max, params.kv_unified = sequences, True
        return params

    with _DEFAULTS_LOCK:
        library.llama_context_default_params = with_sequences
        try:
            llm = llama_cpp.Llama(model_path=str(path), verbose=False, **kwargs)
        finally:
            library.llama_context_default_params = defaults
    if library.llama_n_seq_max(llm.ctx) < sequences:
        llm.close()
        raise RuntimeError(f"llama.cpp gave {path.name} fewer than {sequences} sequences")
    return llm


class GgufVocab:
    def __init__(self, llm) -> None:
        import llama_cpp

        self._lib = llama_cpp
        self.llm = llm
        self.size = llm.n_vocab()
        self._fingerprint: bytes | None = None

    @classmethod
    def open(cls, path: str | os.PathLike) -> GgufVocab:
        """Load only the vocabulary of the GGUF at ``path`` (fast, no weights)."""
        return cls(load_llama(path, vocab_only=True))

    def pieces(self) -> list[str]:
        """The id -> piece table, as the GGUF stores it."""
        vocab = self._lib.llama_model_get_vocab(self.llm.model)
        return [self._lib.llama_vocab_get_text(vocab, i).decode("utf-8", "surrogateescape") for i in range(self.size)]

    @property
    def fingerprint(self) -> bytes:
        if self._fingerprint is None:
            self._fingerprint = vocab_fingerprint(self.pieces())
        return self._fingerprint

    def tokenize(self, text: str, special: bool = True) -> list[int]:
        """Prompt text -> ids, BOS added as the model's metadata asks; ``special``: text such as ``</s>``
        or ``<start_of_turn>`` becomes its control token (the operator's prompt, a chat template's
        markers), else it is plain text (what a user wrote: it cannot end a turn or the text)."""
        return self.llm.tokenize(text.encode("utf-8"), add_bos=True, special=special)

    def tokenize_parts(self, parts: list[tuple[str, bool]]) -> list[int]:
        """``tokenize`` of the parts' text in order, each with its own ``special`` (a chat template's
        markers with it, the messages' text without); BOS once, at the start."""
        ids = self.llm.tokenize(b"", add_bos=True, special=False)
        for text, special in parts:
            if text:
                ids += self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)
        return ids

    def detokenize(self, tokens: Sequence[int]) -> str:
        """ids -> text; an incomplete UTF-8 tail is left out until its bytes arrive."""
        return self.llm.detokenize(list(tokens)).decode("utf-8", "ignore")
