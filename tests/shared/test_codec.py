"""Payload codec: exact round trips, the documented bit layout, hostile input, the wire bench."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from protos import splitspec_pb2 as pb
from shared import codec, wire
from shared.bits import pack_fields
from shared.codec import Encoded
from shared.sparse import SparseDist, quantize, sample_sparse
from sim.bench.wire import naive_draft_frame, run_wire_bench

ROOT = Path(__file__).resolve().parents[2]
BIG_V = 262144


# ---------------------------------------------------------------- references


def ref_pack(values, bits: int) -> bytes:
    """Slow reference: one string of '0'/'1' per value, MSB-first, zero-padded."""
    stream = "".join(format(int(v), f"0{bits}b") for v in values)
    stream += "0" * (-len(stream) % 8)
    return bytes(int(stream[i : i + 8], 2) for i in range(0, len(stream), 8))


def ref_draft_bits(tokens, q: list[SparseDist], vocab_size: int, draft_top_k: int) -> bytes:
    """The rejection-mode layout written straight from encode_draft's docstring."""

    def field(value: int, width: int) -> str:
        assert 0 <= value < (1 << width) or (width == 0 and value == 0)
        return format(value, f"0{width}b") if width else ""

    def ceil_log2(x: int) -> int:
        return math.ceil(math.log2(x)) if x > 1 else 0

    def golomb(value: int, order: int = codec.ID_GOLOMB_ORDER) -> str:
        y = value + (1 << order)
        return "0" * (y.bit_length() - order - 1) + format(y, "b")

    if len(tokens) == 0:
        return b""  # an empty block has no flag either
    b = codec.token_bits(vocab_size)
    ids = [int(s) for dist in q for s in dist.support]
    use_golomb = sum(len(golomb(i)) for i in ids) < len(ids) * b
    write_id = golomb if use_golomb else (lambda i: field(i, b))
    out = "1" if use_golomb else "0"
    for token, dist in zip(tokens, q):
        n, total = dist.support.size, 1 << dist.prob_bits
        out += field(n - 1, ceil_log2(draft_top_k))
        out += field(list(dist.support).index(token), ceil_log2(n))
        out += "".join(write_id(int(s)) for s in dist.support)
        remaining, previous = total, total
        for i in range(n - 1):
            lo = math.ceil(remaining / (n - i))
            hi = min(previous, remaining - (n - 1 - i))
            w = int(dist.weights[i])
            out += field(w - lo, ceil_log2(hi - lo + 1))
            remaining, previous = remaining - w, w
    out += "0" * (-len(out) % 8)
    return bytes(int(out[i : i + 8], 2) for i in range(0, len(out), 8))


def random_q(rng, vocab_size: int, top_k: int, prob_bits: int) -> SparseDist:
    """q̃ of a random distribution, sometimes flat, sometimes peaked."""
    logits = rng.normal(size=vocab_size) * rng.choice([0.5, 2.0, 8.0])
    q = np.exp(logits - logits.max())
    return quantize(q / q.sum(), top_k, prob_bits)


def random_block(rng, vocab_size: int, length: int, top_k: int, prob_bits: int):
    q = [random_q(rng, vocab_size, top_k, prob_bits) for _ in range(length)]
    tokens = [sample_sparse(d, 7, position) for position, d in enumerate(q)]
    return np.array(tokens, dtype=np.int64), q


def assert_same_q(a: list[SparseDist], b: list[SparseDist]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.prob_bits == y.prob_bits
        np.testing.assert_array_equal(x.support, y.support)
        np.testing.assert_array_equal(x.weights, y.weights)


# ---------------------------------------------------------------- bits


@pytest.mark.parametrize(
    ("vocab", "bits"),
    [(1, 8), (2, 8), (256, 8), (257, 9), (300, 9), (65536, 16), (BIG_V, 18), (BIG_V + 1, 19)],
)
def test_token_bits(vocab, bits):
    assert codec.token_bits(vocab) == bits


def test_pack_unpack_match_reference_bit_for_bit():
    rng = np.random.default_rng(0)
    for bits in range(1, 64):
        for n in (0, 1, 2, 7, 33):
            values = (
                rng.integers(0, 1 << bits, size=n, dtype=np.uint64).astype(np.int64)
                if bits < 63
                else (rng.integers(0, 1 << 62, size=n) * 2 + rng.integers(0, 2, size=n))
            )
            packed = codec.pack_bits(values, bits)
            assert packed == ref_pack(values, bits), (bits, n)
            np.testing.assert_array_equal(codec.unpack_bits(packed, bits, n), values)


def test_pack_rejects_out_of_range():
    with pytest.raises(ValueError):
        codec.pack_bits(np.array([4]), 2)
    with pytest.raises(ValueError):
        codec.pack_bits(np.array([-1]), 8)
    with pytest.raises(ValueError, match="trailing bits are not zero"):
        codec.unpack_bits(b"\x01", 7, 1)
    with pytest.raises(ValueError, match="truncated"):
        codec.unpack_bits(b"\x01", 9, 1)


def test_token_count_derivable_from_length():
    rng = np.random.default_rng(1)
    for b in range(8, 21):
        lengths = [(n * b + 7) // 8 for n in range(65)]
        assert len(set(lengths)) == 65  # injective
        for n in range(65):
            assert lengths[n] * 8 // b == n
            tokens = rng.integers(0, 1 << b, size=n)
            enc = codec.encode_tokens(tokens, 1 << b)
            out = codec.decode_tokens(enc.data, enc.compressed, 1 << b, max_tokens=64)
            np.testing.assert_array_equal(out, tokens)


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("vocab", [1, 300, 4096, BIG_V])
@pytest.mark.parametrize("n", [0, 1, 5, 200])
def test_tokens_roundtrip(vocab, n):
    tokens = np.random.default_rng(n).integers(0, vocab, size=n)
    enc = codec.encode_tokens(tokens, vocab)
    assert isinstance(enc, Encoded)
    out = codec.decode_tokens(enc.data, enc.compressed, vocab, max_tokens=n)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, tokens)


@pytest.mark.parametrize("vocab", [300, BIG_V])
@pytest.mark.parametrize("n", [0, 1, 8, 16])
def test_draft_without_q_is_tokens(vocab, n):
    tokens = np.random.default_rng(n).integers(0, vocab, size=n)
    enc = codec.encode_draft(tokens, vocab, None)
    assert enc == codec.encode_tokens(tokens, vocab)
    out, q = codec.decode_draft(enc.data, enc.compressed, vocab, max_tokens=16)
    assert q is None
    np.testing.assert_array_equal(out, tokens)


@pytest.mark.parametrize("vocab", [300, BIG_V])
@pytest.mark.parametrize(
    ("top_k", "prob_bits"), [(1, 8), (3, 4), (12, 8), (16, 8), (16, 2), (32, 12)]
)
@pytest.mark.parametrize("n", [0, 1, 8])
def test_draft_with_q_roundtrip_and_layout(vocab, top_k, prob_bits, n):
    rng = np.random.default_rng([vocab, top_k, prob_bits, n])
    tokens, q = random_block(rng, vocab, n, top_k, prob_bits)
    enc = codec.encode_draft(tokens, vocab, q, draft_top_k=top_k)
    expected = ref_draft_bits(tokens, q, vocab, top_k)
    if enc.compressed:
        assert len(enc.data) < len(expected)
    else:
        assert enc.data == expected
    out, q_out = codec.decode_draft(
        enc.data, enc.compressed, vocab, max_tokens=n, draft_top_k=top_k, prob_bits=prob_bits
    )
    np.testing.assert_array_equal(out, tokens)
    assert_same_q(q, q_out)


def test_draft_with_tied_and_single_weights():
    q = [
        SparseDist(np.array([9, 3, 200, 7]), np.array([64, 64, 64, 64]), 8),
        SparseDist(np.array([299]), np.array([256]), 8),
        SparseDist(np.array([0, 1]), np.array([255, 1]), 8),
    ]
    tokens = [7, 299, 1]
    enc = codec.encode_draft(tokens, 300, q, draft_top_k=4)
    assert enc.data == ref_draft_bits(tokens, q, 300, 4)
    out, q_out = codec.decode_draft(
        enc.data, enc.compressed, 300, max_tokens=3, draft_top_k=4, prob_bits=8
    )
    assert out.tolist() == tokens
    assert_same_q(q, q_out)


def test_compressed_only_when_strictly_smaller():
    rng = np.random.default_rng(3)
    repetitive = np.tile(rng.integers(0, BIG_V, size=4), 100)
    enc = codec.encode_tokens(repetitive, BIG_V)
    raw = codec.pack_bits(repetitive, 18)
    assert enc.compressed and len(enc.data) < len(raw)
    np.testing.assert_array_equal(
        codec.decode_tokens(enc.data, True, BIG_V, max_tokens=400), repetitive
    )
    for n in range(40):
        tokens = rng.integers(0, BIG_V, size=n)
        enc = codec.encode_tokens(tokens, BIG_V)
        raw = codec.pack_bits(tokens, 18)
        if enc.compressed:
            assert len(enc.data) < len(raw)
        else:
            assert enc.data == raw
    assert codec.encode_tokens(rng.integers(0, BIG_V, size=8), BIG_V).compressed is False


# ---------------------------------------------------------------- encoder refusals


def test_encoder_refusals():
    q = [SparseDist(np.array([5, 6]), np.array([200, 56]), 8)]
    with pytest.raises(ValueError, match="not in its q̃ support"):
        codec.encode_draft([7], 300, q, draft_top_k=4)
    with pytest.raises(ValueError, match="draft_top_k is required"):
        codec.encode_draft([5], 300, q)
    with pytest.raises(ValueError, match="support 2 > draft_top_k 1"):
        codec.encode_draft([5], 300, q, draft_top_k=1)
    with pytest.raises(ValueError, match="decreasing weight"):
        codec.encode_draft(
            [5], 300, [SparseDist(np.array([5, 6]), np.array([56, 200]), 8)], draft_top_k=4
        )
    with pytest.raises(ValueError, match="2 drafted tokens but 1"):
        codec.encode_draft([5, 6], 300, q, draft_top_k=4)
    with pytest.raises(ValueError, match="token id 300 >= vocab size 300"):
        codec.encode_tokens([1, 300], 300)
    with pytest.raises(ValueError, match="token id 301 >= vocab size 300"):
        codec.encode_draft(
            [5], 300, [SparseDist(np.array([5, 301]), np.array([200, 56]), 8)], draft_top_k=4
        )


# ---------------------------------------------------------------- decoder hardening


def _rejection_record(n_minus_1, index, ids, weight_fields, k_width=2, b=9):
    """Raw bits of a one-record block (flag 0: fixed-width ids) for V=300 (b = 9), draft_top_k 3 or 4."""
    index_width = math.ceil(math.log2(n_minus_1 + 1)) if n_minus_1 else 0
    values = [0, n_minus_1, index, *ids, *[v for v, _ in weight_fields]]
    widths = [1, k_width, index_width, *[b] * len(ids), *[w for _, w in weight_fields]]
    return pack_fields(np.array(values), np.array(widths))


def test_low_ids_are_exp_golomb_coded_and_round_trip():
    # Frequent pieces sit at low ids in real vocabularies: the encoder switches to exp-Golomb.
    q = [SparseDist(np.array([17, 230, 1500]), np.array([200, 40, 16]), 8), SparseDist(np.array([3]), np.array([256]), 8)]
    tokens = [230, 3]
    enc = codec.encode_draft(tokens, BIG_V, q, draft_top_k=16)
    assert enc.data[0] >> 7 == 1  # the flag bit
    assert enc.data == ref_draft_bits(tokens, q, BIG_V, 16)
    high = [SparseDist(d.support + 200_000, d.weights, 8) for d in q]  # same block, high ids: fixed width
    fixed = ref_draft_bits([t + 200_000 for t in tokens], high, BIG_V, 16)
    assert fixed[0] >> 7 == 0
    assert len(enc.data) < len(fixed)
    out, q_out = codec.decode_draft(enc.data, False, BIG_V, max_tokens=2, draft_top_k=16, prob_bits=8)
    assert out.tolist() == tokens
    assert_same_q(q, q_out)


def test_exp_golomb_prefix_is_bounded():
    # flag 1, n-1 = 0 (4 bits), then a run of 40 zeros where an id's prefix should end by 18 - 10 = 8.
    bits = "1" + "0000" + "0" * 40 + "1" + "0" * 10
    raw = bytes(int((bits + "0" * (-len(bits) % 8))[i : i + 8], 2) for i in range(0, len(bits) + (-len(bits) % 8), 8))
    with pytest.raises(ValueError, match="exp-Golomb prefix too long"):
        codec.decode_draft(raw, False, BIG_V, max_tokens=4, draft_top_k=16, prob_bits=8)


def test_decode_rejects_id_out_of_vocab():
    with pytest.raises(ValueError, match="token id 400 >= vocab size 300"):
        codec.decode_tokens(codec.pack_bits(np.array([5, 400]), 9), False, 300, max_tokens=8)
    raw = _rejection_record(1, 0, [5, 450], [(0, 7)])  # n = 2: w0 in [128, 255], 7 bits
    with pytest.raises(ValueError, match="token id 450 >= vocab size 300"):
        codec.decode_draft(raw, False, 300, max_tokens=8, draft_top_k=4, prob_bits=8)


def test_decode_rejects_too_many_tokens():
    enc = codec.encode_tokens(np.random.default_rng(37).integers(0, BIG_V, size=37), BIG_V)
    assert not enc.compressed
    with pytest.raises(ValueError, match="token payload has 37 tokens, limit is 16"):
        codec.decode_tokens(enc.data, enc.compressed, BIG_V, max_tokens=16)
    with pytest.raises(ValueError, match="37 tokens, limit is 16"):
        codec.decode_draft(enc.data, enc.compressed, BIG_V, max_tokens=16)
    tokens, q = random_block(np.random.default_rng(0), 300, 5, 4, 8)
    enc = codec.encode_draft(tokens, 300, q, draft_top_k=4)
    with pytest.raises(ValueError, match="more than 4 tokens"):
        codec.decode_draft(enc.data, enc.compressed, 300, max_tokens=4, draft_top_k=4, prob_bits=8)
    compressed = codec.encode_tokens(np.zeros(1000, dtype=np.int64), BIG_V)
    assert compressed.compressed
    with pytest.raises(ValueError, match="exceeds 2248 bytes, the most 999 tokens can need"):
        codec.decode_tokens(compressed.data, True, BIG_V, max_tokens=999)


def test_decode_rejects_bad_q_fields():
    # n = 3, V = 300: w0 lies in [86, 254], 169 values in 8 bits; 169 + 86 = 255 is out.
    raw = _rejection_record(2, 0, [1, 2, 3], [(169, 8), (0, 7)])
    with pytest.raises(ValueError, match=r"q̃ weight 255 at offset 0 outside \[86, 254\]"):
        codec.decode_draft(raw, False, 300, max_tokens=8, draft_top_k=4, prob_bits=8)
    raw = _rejection_record(2, 3, [1, 2, 3], [(0, 8), (0, 7)])
    with pytest.raises(ValueError, match="index 3 outside its q̃ support of 3"):
        codec.decode_draft(raw, False, 300, max_tokens=8, draft_top_k=4, prob_bits=8)
    raw = _rejection_record(2, 0, [1, 2, 1], [(0, 8), (0, 7)])
    with pytest.raises(ValueError, match="repeated support ids"):
        codec.decode_draft(raw, False, 300, max_tokens=8, draft_top_k=4, prob_bits=8)
    raw = _rejection_record(3, 0, [1, 2, 3, 4], [(0, 8), (0, 8), (0, 8)])
    with pytest.raises(ValueError, match="support 4 > draft_top_k 3"):
        codec.decode_draft(raw, False, 300, max_tokens=8, draft_top_k=3, prob_bits=8)
    raw = _rejection_record(3, 0, [1, 2, 3, 4], [(0, 1), (0, 1), (0, 1)])
    with pytest.raises(ValueError, match=r"support 4 > 2\*\*1 weights"):
        codec.decode_draft(raw, False, 300, max_tokens=8, draft_top_k=4, prob_bits=1)
    with pytest.raises(ValueError, match="prob_bits"):
        codec.decode_draft(b"", False, 300, max_tokens=8, draft_top_k=4)


def test_decode_rejects_truncated_and_trailing():
    tokens, q = random_block(np.random.default_rng(5), BIG_V, 4, 16, 8)
    enc = codec.encode_draft(tokens, BIG_V, q, draft_top_k=16)
    assert not enc.compressed
    kwargs = {"max_tokens": 8, "draft_top_k": 16, "prob_bits": 8}
    with pytest.raises(ValueError, match="truncated payload"):
        codec.decode_draft(enc.data[:-3], False, BIG_V, **kwargs)
    with pytest.raises(ValueError, match="truncated payload"):  # 8+ bits left: read as a record
        codec.decode_draft(enc.data + b"\x80", False, BIG_V, **kwargs)
    one_record = _rejection_record(0, 0, [299], [])  # 12 bits: 4 padding bits
    assert codec.decode_draft(one_record, False, 300, max_tokens=1, draft_top_k=4, prob_bits=8)[
        0
    ].tolist() == [299]
    with pytest.raises(ValueError, match="trailing bits are not zero"):
        codec.decode_draft(
            one_record[:-1] + bytes([one_record[-1] | 1]),
            False,
            300,
            max_tokens=1,
            draft_top_k=4,
            prob_bits=8,
        )

    one = codec.encode_tokens([5], BIG_V).data  # 18 bits in 3 bytes: 6 padding bits
    with pytest.raises(ValueError, match="trailing bits are not zero"):
        codec.decode_tokens(one[:-1] + bytes([one[-1] | 1]), False, BIG_V, max_tokens=8)
    eight = codec.encode_tokens(np.arange(8), BIG_V).data
    with pytest.raises(ValueError, match="trailing bytes"):
        codec.decode_tokens(eight + b"\x00", False, BIG_V, max_tokens=16)
    with pytest.raises(ValueError, match="trailing bytes"):
        codec.decode_tokens(eight[:-1], False, BIG_V, max_tokens=16)

    packed = codec.encode_tokens(np.zeros(300, dtype=np.int64), BIG_V)
    assert packed.compressed
    with pytest.raises(ValueError, match="truncated payload"):
        codec.decode_tokens(packed.data[:-1], True, BIG_V, max_tokens=300)
    with pytest.raises(ValueError, match="after its zstd frame"):
        codec.decode_tokens(packed.data + b"\x00", True, BIG_V, max_tokens=300)
    with pytest.raises(ValueError, match="truncated payload"):
        codec.decode_tokens(b"", True, BIG_V, max_tokens=300)


def test_decode_rejects_oversized_input():
    big = bytes(codec.MAX_PAYLOAD_BYTES + 1)
    for compressed in (False, True):
        with pytest.raises(ValueError, match=f"limit is {codec.MAX_PAYLOAD_BYTES}"):
            codec.decode_tokens(big, compressed, BIG_V, max_tokens=10**6)
        with pytest.raises(ValueError, match=f"limit is {codec.MAX_PAYLOAD_BYTES}"):
            codec.decode_draft(big, compressed, BIG_V, max_tokens=16, draft_top_k=16, prob_bits=8)


_BOMB_SCRIPT = textwrap.dedent(
    """
    import json, resource, sys, time
    import zstandard as z
    from shared import codec

    def bomb(**params):
        p = z.ZstdCompressionParameters.from_level(1, format=z.FORMAT_ZSTD1_MAGICLESS, **params)
        obj = z.ZstdCompressor(compression_params=p).compressobj()
        chunk = bytes(1 << 20)
        return b"".join(obj.compress(chunk) for _ in range(100)) + obj.flush()  # 100 MB of zeros

    bombs = {
        "small window": bomb(write_content_size=False, window_log=10),
        "default window": bomb(write_content_size=False),
        "content size in header": bomb(write_content_size=True, window_log=10),
    }
    out = {}
    for name, data in bombs.items():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        for decode in (
            lambda: codec.decode_tokens(data, True, 262144, max_tokens=4096),
            lambda: codec.decode_draft(
                data, True, 262144, max_tokens=16, draft_top_k=16, prob_bits=8
            ),
        ):
            try:
                decode()
                error = None
            except ValueError as exc:
                error = str(exc)
            out.setdefault(name, []).append(error)
        out[name].append(time.perf_counter() - start)
        out[name].append((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
        out[name].append(len(data))
    json.dump(out, sys.stdout)
    """
)


def test_zstd_bomb_is_bounded_and_rejected_quickly():
    result = subprocess.run(
        [sys.executable, "-c", _BOMB_SCRIPT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    for name, (tokens_error, draft_error, seconds, rss_growth, size) in json.loads(
        result.stdout
    ).items():
        assert size <= codec.MAX_PAYLOAD_BYTES, name
        assert tokens_error and draft_error, name
        assert seconds < 2.0, (name, seconds)
        assert rss_growth < 16 << 20, (name, rss_growth)  # nowhere near the 100 MB it expands to


def test_fuzz_only_value_error():
    rng = np.random.default_rng(1234)
    seeds = []
    for vocab, top_k, prob_bits in [(300, 4, 8), (BIG_V, 16, 8), (300, 1, 3)]:
        for n in (0, 1, 3, 8):
            tokens, q = random_block(rng, vocab, n, top_k, prob_bits)
            seeds.append(
                ((vocab, top_k, prob_bits), codec.encode_draft(tokens, vocab, q, draft_top_k=top_k))
            )
            seeds.append(((vocab, None, None), codec.encode_tokens(tokens, vocab)))
        seeds.append(
            ((vocab, None, None), codec.encode_tokens(np.zeros(200, dtype=np.int64), vocab))
        )
    outcomes = {"ok": 0, "error": 0}
    for case in range(6000):
        (vocab, top_k, prob_bits), enc = seeds[rng.integers(len(seeds))]
        data = bytearray(enc.data)
        kind = case % 4
        if kind == 0 or not data:
            data = bytearray(
                rng.integers(0, 256, size=rng.integers(0, 80), dtype=np.uint8).tobytes()
            )
        elif kind == 1:
            data = data[: rng.integers(0, len(data))]
        elif kind == 2:
            for _ in range(rng.integers(1, 4)):
                bit = rng.integers(len(data) * 8)
                data[bit // 8] ^= 0x80 >> (bit % 8)
        else:
            data += rng.integers(0, 256, size=rng.integers(1, 6), dtype=np.uint8).tobytes()
        compressed = enc.compressed if rng.random() < 0.8 else not enc.compressed
        try:
            if top_k is None:
                codec.decode_tokens(
                    bytes(data), compressed, vocab, max_tokens=int(rng.integers(0, 300))
                )
            else:
                codec.decode_draft(
                    bytes(data),
                    compressed,
                    vocab,
                    max_tokens=int(rng.integers(0, 12)),
                    draft_top_k=top_k,
                    prob_bits=prob_bits,
                )
            outcomes["ok"] += 1
        except ValueError:
            outcomes["error"] += 1
    assert outcomes["ok"] > 100 and outcomes["error"] > 1000, outcomes


# ---------------------------------------------------------------- framing and the wire bench


def test_framing_helpers():
    assert wire.framed_size(27) == 32
    assert wire.http2_framed_size(27) == 41


def test_coupled_frame_byte_accounting():
    enc = codec.encode_draft(np.arange(8) * 30000, BIG_V)
    assert len(enc.data) == 18 and not enc.compressed
    frame = pb.EdgeFrame(draft=pb.Draft(epoch=127, start_position=16383, payload=enc.data))
    assert wire.framed_size(frame.ByteSize()) == 32  # 4.0 bytes per drafted token
    frame = pb.EdgeFrame(draft=pb.Draft(epoch=128, start_position=16384, payload=enc.data))
    assert wire.framed_size(frame.ByteSize()) == 34  # one more varint byte each


def test_naive_frame_is_valid_protobuf():
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    file = descriptor_pb2.FileDescriptorProto(name="naive.proto", package="naive", syntax="proto3")
    F = descriptor_pb2.FieldDescriptorProto
    position = file.message_type.add(name="NaivePosition")
    position.field.add(name="ids", number=1, type=F.TYPE_INT32, label=F.LABEL_REPEATED)
    position.field.add(name="probs", number=2, type=F.TYPE_FLOAT, label=F.LABEL_REPEATED)
    draft = file.message_type.add(name="NaiveDraft")
    draft.field.add(name="epoch", number=1, type=F.TYPE_UINT64, label=F.LABEL_OPTIONAL)
    draft.field.add(name="start_position", number=2, type=F.TYPE_UINT64, label=F.LABEL_OPTIONAL)
    draft.field.add(name="tokens", number=3, type=F.TYPE_INT32, label=F.LABEL_REPEATED)
    draft.field.add(
        name="q",
        number=4,
        type=F.TYPE_MESSAGE,
        label=F.LABEL_REPEATED,
        type_name=".naive.NaivePosition",
    )
    frame = file.message_type.add(name="NaiveFrame")
    frame.field.add(
        name="draft",
        number=2,
        type=F.TYPE_MESSAGE,
        label=F.LABEL_OPTIONAL,
        type_name=".naive.NaiveDraft",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("naive.NaiveFrame"))

    ids = [np.array([5, 262143, 70000]), np.array([9])]
    probs = [np.array([0.5, 0.25, 0.125], dtype=np.float32), np.array([1.0], dtype=np.float32)]
    data, payload = naive_draft_frame(3, 300, [262143, 9], ids, probs)
    parsed = cls.FromString(data)
    assert parsed.draft.epoch == 3 and parsed.draft.start_position == 300
    assert list(parsed.draft.tokens) == [262143, 9]
    assert [list(p.ids) for p in parsed.draft.q] == [i.tolist() for i in ids]
    assert [list(p.probs) for p in parsed.draft.q] == [p.tolist() for p in probs]
    assert parsed.ByteSize() == len(data)  # our bytes are exactly the canonical encoding
    assert payload == len(data) - 2 - 2 - 3  # minus frame tag+len, epoch, start_position


def test_wire_bench_schema_and_targets():
    result = run_wire_bench(blocks=12)
    keys = {"payload_bytes_per_token", "framed_bytes_per_token", "http2_framed_bytes_per_token"}
    assert set(result) == {"vocab", "draft_len", "floor_bytes_per_token", "modes", "naive"}
    assert result["vocab"] == BIG_V and result["draft_len"] == 8
    assert result["floor_bytes_per_token"] == 2.25
    assert set(result["modes"]) == {"greedy", "coupled", "rejection"}
    for row in result["modes"].values():
        assert set(row) == keys
    assert keys <= set(result["naive"])
    json.dumps(result)
    coupled = result["modes"]["coupled"]
    assert coupled["payload_bytes_per_token"] == 2.25
    assert coupled["framed_bytes_per_token"] <= 4.0
    assert coupled["http2_framed_bytes_per_token"] == pytest.approx(
        coupled["framed_bytes_per_token"] + 9 / 8
    )
    rejection = result["modes"]["rejection"]["framed_bytes_per_token"]
    assert rejection * 2 < result["naive"]["framed_bytes_per_token"]


def test_wire_bench_drafter_hook():
    seen = []

    def peaked(position):
        seen.append(position)
        q = np.full(300, 1e-6)
        q[position % 300] = 1.0
        return q / q.sum()

    result = run_wire_bench(vocab_size=300, draft_len=4, blocks=3, drafter=peaked)
    assert len(seen) == 12
    # q̃ of a one-hot q has one entry: n-1 (4 bits) + 9 id bits per token, 4 tokens in 7 bytes.
    assert result["modes"]["rejection"]["payload_bytes_per_token"] == pytest.approx(7 / 4)


def test_bench_cli():
    from sim.commands.bench import add_bench_commands

    parser = argparse.ArgumentParser()
    add_bench_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        ["wire", "--vocab", "4096", "--blocks", "2", "--draft-len", "4", "--json"]
    )
    assert args.func(args) == 0
    args = parser.parse_args(["wire", "--vocab", "4096", "--blocks", "2"])
    assert args.func(args) == 0


def test_bench_cli_defaults_are_the_products():
    from shared import params
    from sim.commands.bench import add_bench_commands

    parser = argparse.ArgumentParser()
    add_bench_commands(parser.add_subparsers(dest="command", required=True))
    wire = parser.parse_args(["wire"])
    assert (wire.draft_len, wire.draft_top_k, wire.prob_bits) == (
        params.DEFAULT_DRAFT_LEN, params.DEFAULT_DRAFT_TOP_K, params.DEFAULT_PROB_BITS)
    for args in (wire, parser.parse_args(["split"])):
        assert (args.temperature, args.top_k, args.top_p) == (
            params.DEFAULT_TEMPERATURE, params.DEFAULT_TOP_K, params.DEFAULT_TOP_P)
    assert parser.parse_args(["service"]).sessions >= 1
    with pytest.raises(SystemExit):
        parser.parse_args(["split", "--modes", "beam"])


def test_wire_report_table():
    import re

    from sim.bench.wire import format_wire_report

    result = run_wire_bench(blocks=4)
    lines = format_wire_report(result).splitlines()
    assert lines[0].startswith(f"V={BIG_V}  D=8  floor=2.250")
    assert re.split(r"\s{2,}", lines[1].strip()) == ["mode", "payload", "framed", "+http2", "vs floor", "naive/ours"]
    assert set(lines[2]) == {"-", " "}
    rows = {cells[0]: cells for cells in (re.split(r"\s{2,}", line.strip()) for line in lines[3:8])}
    assert list(rows) == ["greedy", "coupled", "rejection", "naive q", "naive ids"]
    keys = ("payload_bytes_per_token", "framed_bytes_per_token", "http2_framed_bytes_per_token")
    rejection, naive = result["modes"]["rejection"], result["naive"]
    assert rows["rejection"][1:4] == [f"{rejection[k]:.3f}" for k in keys]
    assert rows["rejection"][4] == f"{rejection['framed_bytes_per_token'] / 2.25:.2f}x"
    assert rows["rejection"][5] == f"{naive['framed_bytes_per_token'] / rejection['framed_bytes_per_token']:.2f}x"
    assert rows["naive ids"][1:4] == [f"{naive['tokens_only_' + k]:.3f}" for k in keys]
    assert len(rows["naive q"]) == 5  # the references have no naive/ours
    markdown = format_wire_report(result, tablefmt="pipe").splitlines()
    assert markdown[1].startswith("| mode") and markdown[2].startswith("|:-")
