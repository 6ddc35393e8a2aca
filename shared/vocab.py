"""Vocabulary identity: the edge and the cloud must share token ids exactly."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = ["vocab_fingerprint", "describe_vocab", "VocabMismatch", "check_same_vocab"]


class VocabMismatch(ValueError):
    """Drafter and target tokenize differently; their ids cannot be exchanged."""


def vocab_fingerprint(pieces: Sequence[str]) -> bytes:
    """16-byte digest of the id -> piece table (order matters).

    Spaces are canonicalised to SentencePiece's "▁": llama.cpp and
    transformers spell some whitespace pieces of the same vocabulary apart.
    """
    digest = hashlib.sha256()
    for piece in pieces:
        raw = piece.replace(" ", "\u2581").encode("utf-8", "surrogatepass")
        digest.update(len(raw).to_bytes(4, "little"))
        digest.update(raw)
    return digest.digest()[:16]


def describe_vocab(name: str, size: int, fingerprint: bytes) -> str:
    return f"{name} ({size} tokens, fingerprint {fingerprint.hex()[:12]})"


def check_same_vocab(drafter: tuple[int, bytes], target: tuple[int, bytes]) -> None:
    """Raise VocabMismatch naming both vocabularies unless (size, fingerprint) agree."""
    if drafter != target:
        raise VocabMismatch(
            "tokenizer mismatch: drafter vocabulary is "
            + describe_vocab("drafter", *drafter)
            + ", target vocabulary is "
            + describe_vocab("target", *target)
            + "; the drafter must use the target's tokenizer"
        )
