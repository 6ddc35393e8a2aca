"""Wire benchmark: bytes per drafted token on the uplink, for each mode.

Builds realistic draft blocks, encodes them with ``shared.codec``, wraps each
in the real ``EdgeFrame(draft=Draft(...))`` and counts what crosses the link:
the payload alone, the serialized frame plus the 5-byte gRPC prefix
("framed"), and that plus a 9-byte HTTP/2 DATA frame header ("http2_framed").
The same blocks are also written in a naive protobuf encoding for comparison.

Without a drafter, each position's q is synthetic: a random permutation of the
vocabulary with Zipf probabilities ∝ 1/rank^(s/T), s in [1.1, 1.3] and a
random temperature T in [0.5, 1.5], so some positions are peaked and some
flat. Sessions start a few hundred tokens in, positions advance by an
accepted length, and the epoch bumps after each rejected block, so varint
sizes are those of a real session. A real drafter plugs in through
``drafter(position) -> q`` (dense probabilities over the vocabulary).

No model calls, no I/O; deterministic for a given seed.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

import numpy as np

from protos import splitspec_pb2 as pb
from shared import codec
from edge.drafter import propose
from shared.logits import top_candidates
from shared.params import SamplingParams

__all__ = ["MODES", "naive_draft_frame", "run_wire_bench", "zipf_drafter"]

MODES = ("greedy", "coupled", "rejection")
BLOCKS_PER_SESSION = 32
_HEAD = 256  # synthetic q: ranks with their own Zipf mass; the rest share the tail


def zipf_drafter(vocab_size: int, seed: int = 0) -> Callable[[int], np.ndarray]:
    """A synthetic drafter: ``q(position)`` dense [V], Zipf-like over a random ranking.

    The top ``_HEAD`` ranks get mass ∝ rank^(-s/T); the remaining mass (the
    Zipf tail, in closed form) is spread evenly over the other ids, each below
    the last head rank, so top-k selection sees exactly the Zipf head.
    """
    rng = np.random.default_rng([seed, 0x2F1F])

    def drafter(position: int) -> np.ndarray:
        exponent = rng.uniform(1.1, 1.3) / rng.uniform(0.5, 1.5)
        head = min(_HEAD, vocab_size)
        ids = rng.choice(vocab_size, size=head, replace=False)
        mass = np.arange(1, head + 1, dtype=np.float64) ** -exponent
        q = np.zeros(vocab_size, dtype=np.float64)
        if vocab_size > head:
            q[:] = min(
                _zipf_mass(head + 0.5, vocab_size + 0.5, exponent) / (vocab_size - head),
                0.5 * mass[-1],
            )
        q[ids] = mass
        return q / q.sum()

    return drafter


def _zipf_mass(lo: float, hi: float, exponent: float) -> float:
    """Integral of r^-exponent over [lo, hi]: the Zipf mass of the ranks in between."""
    if abs(exponent - 1) < 1e-9:
        return math.log(hi / lo)
    return (hi ** (1 - exponent) - lo ** (1 - exponent)) / (1 - exponent)


# -------------------------------------------------------- naive encoding
#
# Hand-written protobuf wire format (exact bytes, no descriptor), for:
#   message NaivePosition { repeated int32 ids = 1; repeated float probs = 2; }  // packed
#   message NaiveDraft { uint64 epoch = 1; uint64 start_position = 2;
#                        repeated int32 tokens = 3; repeated NaivePosition q = 4; }
#   message NaiveFrame { oneof kind { NaiveDraft draft = 2; } }  // like EdgeFrame


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _len_field(field: int, body: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(body)) + body


def _uint_field(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value) if value else b""  # proto3: 0 is not sent


def _packed_varints(field: int, values) -> bytes:
    return _len_field(field, b"".join(_varint(int(v)) for v in values)) if len(values) else b""


def _packed_floats(field: int, values) -> bytes:
    return _len_field(field, struct.pack(f"<{len(values)}f", *values)) if len(values) else b""


def naive_draft_frame(
    epoch: int, start_position: int, tokens, q_ids=None, q_probs=None
) -> tuple[bytes, int]:
    """(serialized NaiveFrame, payload bytes): tokens as packed int32 and, if
    given, per token the top-k ids as packed int32 and probs as packed float32.
    Payload bytes are the tokens and q fields (tags included), without epoch
    and position.
    """
    payload = _packed_varints(3, tokens)
    if q_ids is not None:
        payload += b"".join(
            _len_field(4, _packed_varints(1, ids) + _packed_floats(2, probs))
            for ids, probs in zip(q_ids, q_probs)
        )
    draft = _uint_field(1, epoch) + _uint_field(2, start_position) + payload
    return _len_field(2, draft), len(payload)


# -------------------------------------------------------- the benchmark


def _positions(rng: np.random.Generator, blocks: int, draft_len: int) -> list[tuple[int, int]]:
    """(epoch, start_position) per block: sessions of BLOCKS_PER_SESSION blocks."""
    out = []
    for b in range(blocks):
        if b % BLOCKS_PER_SESSION == 0:
            epoch, position = 0, int(rng.integers(64, 512))
        out.append((epoch, position))
        accepted = int(rng.binomial(draft_len, 0.7))
        position += accepted + 1
        epoch += accepted < draft_len
    return out


def run_wire_bench(
    vocab_size: int = 262144,
    draft_len: int = 8,
    draft_top_k: int = 16,
    prob_bits: int = 8,
    blocks: int = 200,
    seed: int = 0,
    drafter: Callable[[int], np.ndarray] | None = None,
) -> dict:
    """Bytes per drafted token for each mode and for the naive encoding.

    Returns ``{"vocab", "draft_len", "floor_bytes_per_token", "modes":
    {mode: {"payload_bytes_per_token", "framed_bytes_per_token",
    "http2_framed_bytes_per_token"}}, "naive": {...}}``. ``naive`` has the
    same three keys for tokens plus top-k ids and float probs (what a plain
    protobuf schema would send for rejection mode, k = ``draft_top_k``), and
    ``tokens_only_*`` keys for tokens alone (the greedy/coupled analogue).
    """
    if blocks < 1 or draft_len < 1:
        raise ValueError("blocks and draft_len must be >= 1")
    rng = np.random.default_rng(seed)
    drafter = drafter or zipf_drafter(vocab_size, seed)
    # The drafter's own proposal rule, on log q as logits (temperature 1 keeps q as it is).
    params = {
        mode: SamplingParams(mode=mode, temperature=0.0 if mode == "greedy" else 1.0, seed=seed,
                             draft_top_k=draft_top_k, prob_bits=prob_bits)
        for mode in MODES
    }
    totals = {name: np.zeros(3) for name in (*MODES, "naive", "naive_tokens")}

    def add(name: str, payload: int, message: int) -> None:
        totals[name] += (payload, codec.grpc_framed_size(message), codec.http2_framed_size(message))

    for epoch, start in _positions(rng, blocks, draft_len):
        drafted = {mode: [] for mode in MODES}
        q_tilde, naive_ids, naive_probs = [], [], []
        for offset in range(draft_len):
            position = start + offset
            q = np.asarray(drafter(position), dtype=np.float64)
            with np.errstate(divide="ignore"):
                logits = np.log(q)
            proposals = {mode: propose(logits, params[mode], position) for mode in MODES}
            for mode in MODES:
                drafted[mode].append(proposals[mode][0])
            q_tilde.append(proposals["rejection"][1])
            top, _ = top_candidates(logits, params["coupled"], limit=draft_top_k)
            naive_ids.append(top)
            naive_probs.append(q[top].astype(np.float32))
        for mode in MODES:
            q_arg = q_tilde if mode == "rejection" else None
            enc = codec.encode_draft(drafted[mode], vocab_size, q_arg, draft_top_k=draft_top_k)
            frame = pb.EdgeFrame(
                draft=pb.Draft(
                    epoch=epoch, start_position=start, payload=enc.data, compressed=enc.compressed
                )
            )
            add(mode, len(enc.data), frame.ByteSize())
        message, payload = naive_draft_frame(
            epoch, start, drafted["rejection"], naive_ids, naive_probs
        )
        add("naive", payload, len(message))
        message, payload = naive_draft_frame(epoch, start, drafted["greedy"])
        add("naive_tokens", payload, len(message))

    per_token = {name: (t / (blocks * draft_len)).tolist() for name, t in totals.items()}
    keys = ("payload_bytes_per_token", "framed_bytes_per_token", "http2_framed_bytes_per_token")
    naive = dict(zip(keys, per_token["naive"]))
    naive.update({f"tokens_only_{key}": v for key, v in zip(keys, per_token["naive_tokens"])})
    return {
        "vocab": vocab_size,
        "draft_len": draft_len,
        "floor_bytes_per_token": math.log2(vocab_size) / 8,
        "modes": {mode: dict(zip(keys, per_token[mode])) for mode in MODES},
        "naive": naive,
    }
