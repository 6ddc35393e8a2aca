"""Opening the edge's drafter from a command-line choice, and checking it
speaks the same vocabulary as the target."""

from __future__ import annotations

from edge.llama_drafter import LlamaDrafter
from edge.lookup_drafter import LookupFirstDrafter
from edge.ngram_drafter import NgramDrafter
from shared.models import default_gguf_path
from shared.vocab import check_same_vocab

__all__ = ["open_llama_drafter", "open_drafter", "NGRAM"]

NGRAM = "ngram"  # the drafter choice that means prompt lookup instead of a GGUF


def open_llama_drafter(path: str | None, *, n_threads: int | None = None, n_ctx: int = 4096,
                       lookup: bool = False) -> LlamaDrafter | LookupFirstDrafter:
    """The GGUF at ``path`` (None = the default Gemma drafter); ``lookup``: behind prompt lookup
    (``edge.lookup_drafter``)."""
    drafter = LlamaDrafter(path or default_gguf_path(), n_threads=n_threads, n_ctx=n_ctx)
    return LookupFirstDrafter(drafter) if lookup else drafter


def open_drafter(choice: str | None, *, vocab_size: int, fingerprint: bytes, n_threads: int | None = None, n_ctx: int = 4096,
                 lookup: bool = False):
    """A drafter for ``choice`` whose vocabulary matches (vocab_size, fingerprint); ``lookup`` as
    ``open_llama_drafter`` says (the n-gram choice is prompt lookup alone).

    Raises ``shared.vocab.VocabMismatch`` naming both vocabularies otherwise.
    """
    if choice == NGRAM:
        return NgramDrafter(vocab_size)
    drafter = open_llama_drafter(choice, n_threads=n_threads, n_ctx=n_ctx, lookup=lookup)
    try:
        check_same_vocab((drafter.vocab.size, drafter.vocab.fingerprint), (vocab_size, fingerprint))
    except ValueError:
        drafter.close()
        raise
    return drafter
