"""Bits on the wire, below the payload codec (``shared.codec``): fixed-width ids, fields, exp-Golomb.

Values are packed MSB-first and zero-padded to a whole byte; ``BitReader``
reads them back and refuses what runs past the end or leaves padding that is
not zero (``ValueError``, as the codec promises for hostile input). Pure
numpy: no compression, no framing.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ID_GOLOMB_ORDER", "MAX_VOCAB_SIZE", "BitReader", "check_vocab", "bits_to_int", "golomb_bits", "golomb_fields", "pack_bits", "pack_fields",
           "read_golomb", "token_bits", "unpack_bits"]

MAX_VOCAB_SIZE = 1 << 31  # ids must fit a uint32 field on the wire


def check_vocab(vocab_size: int) -> None:
    """``ValueError`` unless ``vocab_size`` is in [1, ``MAX_VOCAB_SIZE``]."""
    if not 1 <= int(vocab_size) <= MAX_VOCAB_SIZE:
        raise ValueError(f"vocab size must be in [1, {MAX_VOCAB_SIZE}], got {vocab_size}")


def token_bits(vocab_size: int) -> int:
    """Bits per packed token id: ``max(8, ceil(log2 V))``.

    The 8-bit floor keeps the token count derivable from the byte length.
    """
    check_vocab(vocab_size)
    return max(8, (int(vocab_size) - 1).bit_length())


def pack_bits(values: np.ndarray, bits: int) -> bytes:
    """Pack non-negative integers [n] at ``bits`` bits each, MSB-first, zero-padded."""
    if not 1 <= bits <= 63:
        raise ValueError(f"bits must be in [1, 63], got {bits}")
    v = np.asarray(values)
    if v.ndim != 1:
        raise ValueError(f"values must be 1-D, got shape {v.shape}")
    if v.size == 0:
        return b""
    if not np.issubdtype(v.dtype, np.integer):
        raise ValueError(f"values must be integers, got {v.dtype}")
    v = v.astype(np.int64)
    if int(v.min()) < 0 or int(v.max()) >> bits:
        raise ValueError(f"values must be in [0, 2**{bits})")
    shifts = np.arange(bits - 1, -1, -1, dtype=np.int64)
    matrix = ((v[:, None] >> shifts) & 1).astype(np.uint8)  # [n, bits]
    return np.packbits(matrix.reshape(-1)).tobytes()


def unpack_bits(data: bytes, bits: int, count: int) -> np.ndarray:
    """Inverse of ``pack_bits``: [count] int64. The length and padding must be exact."""
    if not 1 <= bits <= 63:
        raise ValueError(f"bits must be in [1, 63], got {bits}")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    need = (count * bits + 7) // 8
    if len(data) < need:
        raise ValueError(f"truncated payload: {len(data)} bytes, {count} values need {need}")
    if len(data) > need:
        raise ValueError(f"payload has {len(data) - need} trailing bytes")
    stream = np.unpackbits(np.frombuffer(data, dtype=np.uint8))
    if stream[count * bits :].any():
        raise ValueError("trailing bits are not zero")
    return bits_to_int(stream[: count * bits].reshape(count, bits))


def bits_to_int(matrix: np.ndarray) -> np.ndarray:
    """Rows of MSB-first bits [n, w] to int64 [n]."""
    weights = np.left_shift(np.int64(1), np.arange(matrix.shape[1] - 1, -1, -1, dtype=np.int64))
    return matrix.astype(np.int64) @ weights


def pack_fields(values: np.ndarray, widths: np.ndarray) -> bytes:
    """Pack fields of varying widths (0 allowed) back to back, MSB-first, zero-padded."""
    values = np.asarray(values, dtype=np.int64)
    widths = np.asarray(widths, dtype=np.int64)
    if values.size == 0 or int(widths.max()) == 0:
        return b""
    maxw = int(widths.max())
    shifts = np.arange(maxw - 1, -1, -1, dtype=np.int64)
    matrix = ((values[:, None] >> shifts) & 1).astype(np.uint8)  # [m, maxw], right-aligned
    keep = shifts[None, :] < widths[:, None]  # each row's low `width` bits
    return np.packbits(matrix[keep]).tobytes()


class BitReader:
    """Reads MSB-first fields from a byte string; a short read is a ValueError."""

    def __init__(self, data: bytes) -> None:
        self.bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8))
        self.pos = 0

    @property
    def left(self) -> int:
        return self.bits.size - self.pos

    def read(self, width: int) -> int:
        return int(self.read_many(1, width)[0]) if width else 0

    def read_many(self, count: int, width: int) -> np.ndarray:
        end = self.pos + count * width
        if end > self.bits.size:
            raise ValueError("truncated payload")
        chunk = self.bits[self.pos : end].reshape(count, width)
        self.pos = end
        return bits_to_int(chunk)

    def read_zeros(self, limit: int) -> int:
        """Count the 0 bits before the next 1 and consume both; ValueError past ``limit`` zeros."""
        window = self.bits[self.pos : self.pos + limit + 1]
        ones = np.flatnonzero(window)
        if ones.size == 0:
            raise ValueError("truncated payload" if window.size <= limit else "exp-Golomb prefix too long")
        self.pos += int(ones[0]) + 1
        return int(ones[0])

    def check_padding(self) -> None:
        if self.left >= 8:
            raise ValueError(f"payload has {self.left // 8} trailing bytes")
        if self.bits[self.pos :].any():
            raise ValueError("trailing bits are not zero")


# Support ids in rejection records may be exp-Golomb coded with this order:
# tokenizer vocabularies put frequent pieces at low ids, so a drafter's likely
# tokens cost ~14 bits instead of 18 for V = 262144 (measured on Gemma 3).
ID_GOLOMB_ORDER = 10


def golomb_bits(ids: np.ndarray, order: int = ID_GOLOMB_ORDER) -> np.ndarray:
    """Exp-Golomb code length of each id: 2 * bitlen(id + 2**order) - order - 1."""
    y = np.asarray(ids, dtype=np.int64) + (1 << order)
    return 2 * (np.floor(np.log2(y)).astype(np.int64) + 1) - order - 1


def golomb_fields(ids: np.ndarray, order: int = ID_GOLOMB_ORDER) -> tuple[np.ndarray, np.ndarray]:
    """(values, widths) of each id's code: a run of zeros, then id + 2**order in full."""
    y = np.asarray(ids, dtype=np.int64) + (1 << order)
    length = np.floor(np.log2(y)).astype(np.int64) + 1
    values = np.stack([np.zeros_like(y), y], axis=1).reshape(-1)
    widths = np.stack([length - order - 1, length], axis=1).reshape(-1)
    return values, widths


def read_golomb(reader: BitReader, count: int, id_bits: int, order: int = ID_GOLOMB_ORDER) -> np.ndarray:
    out = np.empty(count, dtype=np.int64)
    for i in range(count):
        zeros = reader.read_zeros(max(id_bits - order, 0))
        out[i] = ((1 << (zeros + order)) | reader.read(zeros + order)) - (1 << order)
    return out
