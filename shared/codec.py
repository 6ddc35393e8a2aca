"""Payload codec: token ids and q̃ as compact bit-packed blocks, zstd optional.

Promises:

- Token ids are packed at ``token_bits(V) = max(8, ceil(log2 V))`` bits,
  MSB-first, zero-padded to a whole byte. No count is sent: for b >= 8 bits
  per id, n ↦ ceil(n*b/8) is injective, so n = floor(8*L/b) from the byte
  length L (n*b <= 8L < n*b + 8 <= (n+1)*b). The padding is < 8 bits and must
  be zero.
- In rejection mode a draft block is a run of per-token records (layout in
  ``encode_draft``); every record holds at least b >= 8 bits, so the decoder
  reads records while 8 or more bits remain and what is left is the padding.
- zstd frames are magicless, with no checksum and no content size, and are
  used only when strictly smaller than the raw block (the ``compressed`` flag).
- Decoding treats its input as hostile: input is at most ``MAX_PAYLOAD_BYTES``,
  decompressed output is capped by what ``max_tokens`` can need (and by
  ``MAX_DECODED_BYTES``) with a streaming decompressor that never produces
  more than the cap, and every id, count and weight is checked. Any problem
  raises ``ValueError`` with a message that says what was wrong; no other
  exception escapes on arbitrary bytes.

Bit-level packing is ``shared.bits``'s. The codec knows payload bits only; framing sizes and message caps are the
wire contract's (``shared.wire``).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import zstandard

from shared.bits import (
    ID_GOLOMB_ORDER,
    BitReader,
    golomb_bits,
    golomb_fields,
    pack_bits,
    pack_fields,
    read_golomb,
    token_bits,
    unpack_bits,
)
from shared.sparse import MAX_PROB_BITS, SparseDist

__all__ = [
    "MAX_DECODED_BYTES",
    "MAX_DRAFT_TOP_K",
    "MAX_PAYLOAD_BYTES",
    "ZSTD_LEVEL",
    "Encoded",
    "decode_draft",
    "decode_tokens",
    "draft_record_bits",
    "encode_draft",
    "encode_tokens",
    "pack_bits",
    "token_bits",
    "unpack_bits",
]

# Largest payload accepted on the wire, compressed or not: above the largest the protocol allows (a block
# of 64 drafts, each with a q̃ over MAX_DRAFT_TOP_K ids of up to 32 bits and weights of up to 16: 384 KiB;
# a 16,384-token prompt at 32 bits: 64 KiB), and no more, so a frame cannot cost the verifier more.
MAX_PAYLOAD_BYTES = 512 << 10
MAX_DECODED_BYTES = 8 << 20  # hard ceiling on decompressed size, whatever max_tokens says
MAX_DRAFT_TOP_K = 1024  # largest q̃ support a session may configure
ZSTD_LEVEL = 3

_MIN_WINDOW_LOG = 10  # zstd's smallest window, 1 KiB


@dataclass(frozen=True)
class Encoded:
    """One payload as it goes on the wire."""

    data: bytes
    compressed: bool  # data is a magicless zstd frame


# ---------------------------------------------------------------- bit packing


# ---------------------------------------------------------------- zstd


def _compressor() -> zstandard.ZstdCompressor:
    params = zstandard.ZstdCompressionParameters.from_level(
        ZSTD_LEVEL,
        format=zstandard.FORMAT_ZSTD1_MAGICLESS,
        write_checksum=False,
        write_content_size=False,
    )
    return zstandard.ZstdCompressor(compression_params=params)


def _maybe_compress(raw: bytes) -> Encoded:
    if raw:
        packed = _compressor().compress(raw)
        if len(packed) < len(raw):
            return Encoded(packed, True)
    return Encoded(raw, False)


def _window_limit(cap: int) -> int:
    """Largest zstd window accepted: the power of two covering ``cap``, at least 1 KiB.

    Our own frames never need more (zstd shrinks the window to the input size),
    and it bounds the decoder's buffers whatever a hostile header claims.
    """
    return 1 << max(_MIN_WINDOW_LOG, (max(cap, 1) - 1).bit_length())


def _read_payload(data: bytes, compressed: bool, cap: int, what: str, max_tokens: int) -> bytes:
    """Check the input size and return the raw block, decompressed to at most ``cap`` bytes."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"{what} must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"{what} is {len(data)} bytes, limit is {MAX_PAYLOAD_BYTES}")
    if not compressed:
        return data  # bounded by MAX_PAYLOAD_BYTES; counts are checked by the caller
    dctx = zstandard.ZstdDecompressor(
        max_window_size=_window_limit(cap), format=zstandard.FORMAT_ZSTD1_MAGICLESS
    )
    try:
        # Pass 1: streaming, never more than cap + 1 bytes out, whatever the frame says.
        produced = 0
        with dctx.stream_reader(io.BytesIO(data), read_across_frames=False) as reader:
            while chunk := reader.read(cap + 1 - produced):
                produced += len(chunk)
                if produced > cap:
                    raise ValueError(
                        f"decompressed {what} exceeds {cap} bytes, "
                        f"the most {max_tokens} tokens can need"
                    )
        # Pass 2: the same frame is now known to decode to <= cap bytes; check
        # that it is complete and that nothing follows it.
        dobj = dctx.decompressobj()
        raw = dobj.decompress(data)
    except zstandard.ZstdError as exc:
        raise ValueError(f"bad zstd frame in {what}: {exc}") from None
    if not dobj.eof:
        raise ValueError(f"truncated payload: zstd frame in {what} is incomplete")
    if dobj.unused_data:
        raise ValueError(f"{what} has {len(dobj.unused_data)} bytes after its zstd frame")
    if len(raw) > cap:  # cannot happen after pass 1; kept as a guard
        raise ValueError(f"decompressed {what} exceeds {cap} bytes")
    return raw


def _cap(max_tokens: int, bits_per_token: int) -> int:
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    return min((max_tokens * bits_per_token + 7) // 8, MAX_DECODED_BYTES)


# ---------------------------------------------------------------- tokens


def _as_tokens(tokens, vocab_size: int) -> np.ndarray:
    t = np.asarray(tokens)
    if t.size == 0:
        return np.zeros(0, dtype=np.int64)
    if t.ndim != 1 or not np.issubdtype(t.dtype, np.integer):
        raise ValueError(f"tokens must be a 1-D integer array, got {t.dtype} {t.shape}")
    t = t.astype(np.int64)
    _check_ids(t, vocab_size)
    return t


def _check_ids(ids: np.ndarray, vocab_size: int) -> None:
    bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    if bad.size:
        token = int(ids[bad[0]])
        raise ValueError(
            f"token id {token} is negative"
            if token < 0
            else f"token id {token} >= vocab size {vocab_size}"
        )


def encode_tokens(tokens, vocab_size: int) -> Encoded:
    """Token ids [n] as a packed block (prompts, cloud-only chunks, greedy/coupled drafts)."""
    b = token_bits(vocab_size)
    return _maybe_compress(pack_bits(_as_tokens(tokens, vocab_size), b))


def decode_tokens(data: bytes, compressed: bool, vocab_size: int, *, max_tokens: int) -> np.ndarray:
    """Inverse of ``encode_tokens``: int64 [n], n <= ``max_tokens``, every id < V."""
    b = token_bits(vocab_size)
    raw = _read_payload(data, compressed, _cap(max_tokens, b), "token payload", max_tokens)
    count = len(raw) * 8 // b
    if count > max_tokens:
        raise ValueError(f"token payload has {count} tokens, limit is {max_tokens}")
    if len(raw) != (count * b + 7) // 8:
        raise ValueError(f"payload has {len(raw) - (count * b + 7) // 8} trailing bytes")
    tokens = unpack_bits(raw, b, count)
    _check_ids(tokens, vocab_size)
    return tokens


# ---------------------------------------------------------------- drafts


def _width(values: int) -> int:
    """Bits to store one of ``values`` equally likely choices: ceil(log2 values)."""
    return (values - 1).bit_length() if values > 1 else 0


def _weight_range(remaining: int, slots: int, previous: int) -> tuple[int, int]:
    """Range [lo, hi] of the next weight of a non-increasing q̃.

    ``remaining`` mass is split over ``slots`` weights (this one included),
    each >= 1 and none above ``previous``: this one is the largest of them,
    so at least ceil(remaining / slots), and it leaves >= 1 for each of the
    others. Any value in range keeps the rest feasible, so the implied last
    weight is always in [1, previous].
    """
    return -(-remaining // slots), min(previous, remaining - (slots - 1))


def _check_rejection_params(vocab_size: int, draft_top_k: int, prob_bits: int | None) -> None:
    if not 1 <= draft_top_k <= MAX_DRAFT_TOP_K:
        raise ValueError(f"draft_top_k must be in [1, {MAX_DRAFT_TOP_K}], got {draft_top_k}")
    if prob_bits is None or not 1 <= prob_bits <= MAX_PROB_BITS:
        raise ValueError(f"prob_bits must be in [1, {MAX_PROB_BITS}], got {prob_bits}")


def draft_record_bits(vocab_size: int, draft_top_k: int, prob_bits: int) -> int:
    """Largest record of one drafted token in rejection mode, in bits (for the size cap)."""
    k, b = draft_top_k, token_bits(vocab_size)
    longest_id = max(b, 2 * b + 1 - ID_GOLOMB_ORDER)  # fixed width, or exp-Golomb of an id < 2**b
    return _width(k) + _width(k) + k * longest_id + (k - 1) * prob_bits + 1


def encode_draft(
    tokens, vocab_size: int, q: list[SparseDist] | None = None, *, draft_top_k: int | None = None
) -> Encoded:
    """A draft block: token ids [D] alone, or with their q̃ (rejection mode).

    Without ``q`` the block is ``encode_tokens(tokens)``. With ``q`` (one q̃
    per drafted token, support ordered by decreasing weight as ``quantize``
    makes it, every token inside its own support) the block is one flag bit,
    then one record per token, MSB-first, back to back, zero-padded to a byte.
    The flag says how support ids are written: 0 = token_bits(V) bits each,
    1 = exp-Golomb of order ``ID_GOLOMB_ORDER`` (cheaper for the low ids of
    frequent pieces); the encoder picks whichever block is shorter.

    ====================  =========================================================
    n - 1                 ceil(log2 K) bits; K = ``draft_top_k`` (0 bits when K = 1)
    index of the token    ceil(log2 n) bits, its place in the support
    support ids           n ids, in q̃ order, as the flag says
    weights w_0..w_{n-2}  field i is w_i - lo_i in ceil(log2(hi_i - lo_i + 1)) bits
    ====================  =========================================================

    With R_i = 2**B - (w_0 + ... + w_{i-1}): lo_i = ceil(R_i / (n - i)) and
    hi_i = min(w_{i-1}, R_i - (n - 1 - i)), w_{-1} = 2**B. The last weight is
    R_{n-1}. The order makes the bounds tight (a peaked q̃ spends few bits on
    its tail), and every decodable value is a valid q̃: the weights are >= 1,
    non-increasing and sum to 2**B by construction. Each record holds at least
    8 bits (an id costs token_bits >= 8 or at least ORDER + 1 = 11 bits), so the
    token count follows from the length: records are read while 8 or more bits
    remain after the flag.
    """
    t = _as_tokens(tokens, vocab_size)
    if q is None:
        return encode_tokens(t, vocab_size)
    if draft_top_k is None:
        raise ValueError("draft_top_k is required to encode q̃")
    if len(q) != t.size:
        raise ValueError(f"{t.size} drafted tokens but {len(q)} q̃")
    if t.size == 0:
        return Encoded(b"", False)
    prob_bits = q[0].prob_bits
    _check_rejection_params(vocab_size, draft_top_k, prob_bits)
    b = token_bits(vocab_size)
    all_ids = np.concatenate([dist.support for dist in q])
    golomb = int(golomb_bits(all_ids).sum()) < all_ids.size * b
    values: list[np.ndarray] = [np.array([int(golomb)])]
    widths: list[np.ndarray] = [np.array([1])]
    for i, (token, dist) in enumerate(zip(t.tolist(), q)):
        support, weights = dist.support, dist.weights
        n = support.size
        if dist.prob_bits != prob_bits:
            raise ValueError(
                f"q̃ at offset {i} has prob_bits {dist.prob_bits}, block has {prob_bits}"
            )
        if n > draft_top_k:
            raise ValueError(f"q̃ at offset {i} has support {n} > draft_top_k {draft_top_k}")
        _check_ids(support, vocab_size)
        if (np.diff(weights) > 0).any():
            raise ValueError(f"q̃ at offset {i} is not ordered by decreasing weight")
        hit = np.flatnonzero(support == token)
        if hit.size == 0:
            raise ValueError(f"drafted token {token} at offset {i} is not in its q̃ support")
        head = [n - 1, int(hit[0])]
        head_w = [_width(draft_top_k), _width(n)]
        w_vals, w_widths = [], []
        remaining, previous = 1 << prob_bits, 1 << prob_bits
        for j in range(n - 1):
            lo, hi = _weight_range(remaining, n - j, previous)
            w = int(weights[j])
            w_vals.append(w - lo)  # lo <= w <= hi holds for any valid ordered q̃
            w_widths.append(_width(hi - lo + 1))
            remaining, previous = remaining - w, w
        id_values, id_widths = golomb_fields(support) if golomb else (support, np.full(n, b))
        values += [np.array(head), id_values, np.array(w_vals, dtype=np.int64)]
        widths += [np.array(head_w), id_widths, np.array(w_widths, dtype=np.int64)]
    raw = pack_fields(np.concatenate(values), np.concatenate(widths))
    return _maybe_compress(raw)


def decode_draft(
    data: bytes,
    compressed: bool,
    vocab_size: int,
    *,
    max_tokens: int,
    draft_top_k: int | None = None,
    prob_bits: int | None = None,
) -> tuple[np.ndarray, list[SparseDist] | None]:
    """Inverse of ``encode_draft``: (tokens int64 [D], q̃ list or None).

    q̃ is expected iff ``draft_top_k`` is given (then ``prob_bits`` too).
    D <= ``max_tokens``; ids < V; supports distinct and <= ``draft_top_k``.
    """
    if draft_top_k is None:
        return decode_tokens(data, compressed, vocab_size, max_tokens=max_tokens), None
    _check_rejection_params(vocab_size, draft_top_k, prob_bits)
    b = token_bits(vocab_size)
    cap = _cap(max_tokens, draft_record_bits(vocab_size, draft_top_k, prob_bits))
    raw = _read_payload(data, compressed, cap, "draft payload", max_tokens)
    reader = BitReader(raw)
    tokens: list[int] = []
    q: list[SparseDist] = []
    total = 1 << prob_bits
    golomb = bool(reader.read(1)) if raw else False
    while reader.left >= 8:
        if len(tokens) == max_tokens:
            raise ValueError(
                f"draft payload has more than {max_tokens} tokens, limit is {max_tokens}"
            )
        offset = len(tokens)
        n = reader.read(_width(draft_top_k)) + 1
        if n > draft_top_k:
            raise ValueError(f"q̃ at offset {offset} has support {n} > draft_top_k {draft_top_k}")
        if n > total:
            raise ValueError(f"q̃ at offset {offset} has support {n} > 2**{prob_bits} weights")
        index = reader.read(_width(n))
        if index >= n:
            raise ValueError(f"drafted token index {index} outside its q̃ support of {n}")
        support = read_golomb(reader, n, b) if golomb else reader.read_many(n, b)
        _check_ids(support, vocab_size)
        if np.unique(support).size != n:
            raise ValueError(f"q̃ at offset {offset} has repeated support ids")
        weights = np.empty(n, dtype=np.int64)
        remaining, previous = total, total
        for j in range(n - 1):
            lo, hi = _weight_range(remaining, n - j, previous)
            w = lo + reader.read(_width(hi - lo + 1))
            if w > hi:
                raise ValueError(f"q̃ weight {w} at offset {offset} outside [{lo}, {hi}]")
            weights[j] = w
            remaining, previous = remaining - w, w
        weights[n - 1] = remaining
        q.append(SparseDist(support=support, weights=weights, prob_bits=prob_bits))
        tokens.append(int(support[index]))
    reader.check_padding()
    return np.array(tokens, dtype=np.int64), q
