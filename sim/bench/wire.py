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
``drafter(position) -> q`` (dense probabilities over the vocabulary);
``recorded_drafter`` makes one from a GGUF model, and is the only function
here that loads a model. The rest makes no model calls and no I/O and is
deterministic for a given seed. ``format_wire_report`` renders the result.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from tabulate import tabulate

from edge.drafter import propose
from protos import splitspec_pb2 as pb
from shared import codec
from shared.logits import top_candidates
from shared.params import (
    DEFAULT_DRAFT_LEN,
    DEFAULT_DRAFT_TOP_K,
    DEFAULT_PROB_BITS,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    SamplingParams,
)
from shared.verdict import Verdict
from shared.wire import framed_size, http2_framed_size, next_epoch

__all__ = [
    "MODES",
    "format_wire_report",
    "naive_draft_frame",
    "recorded_drafter",
    "run_wire_bench",
    "zipf_drafter",
]

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
# What a plain protobuf schema would send, built at run time (not a .proto:
# protos/splitspec.proto is the wire schema's only source):
#   message NaivePosition { repeated uint32 ids = 1; repeated float probs = 2; }  // packed
#   message NaiveDraft { uint64 epoch = 1; uint64 start_position = 2;
#                        repeated uint32 tokens = 3; repeated NaivePosition q = 4; }
#   message NaiveFrame { oneof kind { NaiveDraft draft = 2; } }  // framed like EdgeFrame


def _naive_messages() -> tuple[type, type]:
    """(NaiveFrame, NaiveDraft) classes from a FileDescriptorProto in a private pool."""
    F = descriptor_pb2.FieldDescriptorProto
    packed = descriptor_pb2.FieldOptions(packed=True)
    file = descriptor_pb2.FileDescriptorProto(
        name="splitspec_naive_bench.proto", package="splitspec.naive", syntax="proto3"
    )
    position = file.message_type.add(name="NaivePosition")
    position.field.add(name="ids", number=1, type=F.TYPE_UINT32, label=F.LABEL_REPEATED, options=packed)
    position.field.add(name="probs", number=2, type=F.TYPE_FLOAT, label=F.LABEL_REPEATED, options=packed)
    draft = file.message_type.add(name="NaiveDraft")
    draft.field.add(name="epoch", number=1, type=F.TYPE_UINT64, label=F.LABEL_OPTIONAL)
    draft.field.add(name="start_position", number=2, type=F.TYPE_UINT64, label=F.LABEL_OPTIONAL)
    draft.field.add(name="tokens", number=3, type=F.TYPE_UINT32, label=F.LABEL_REPEATED, options=packed)
    draft.field.add(name="q", number=4, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                    type_name=".splitspec.naive.NaivePosition")
    frame = file.message_type.add(name="NaiveFrame")
    frame.oneof_decl.add(name="kind")
    frame.field.add(name="draft", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".splitspec.naive.NaiveDraft", oneof_index=0)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return tuple(
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"splitspec.naive.{name}"))
        for name in ("NaiveFrame", "NaiveDraft")
    )


NaiveFrame, NaiveDraft = _naive_messages()


def _naive_frame(epoch: int, start_position: int, tokens, q_ids=None, q_probs=None):
    """(NaiveFrame message, payload bytes); see `naive_draft_frame`."""
    draft = NaiveDraft(tokens=[int(t) for t in tokens])
    if q_ids is not None:
        for ids, probs in zip(q_ids, q_probs):
            draft.q.add(ids=[int(i) for i in ids], probs=[float(p) for p in probs])
    payload = draft.ByteSize()  # tokens and q only: epoch and position are still 0, so unsent
    draft.epoch, draft.start_position = epoch, start_position
    return NaiveFrame(draft=draft), payload


def naive_draft_frame(
    epoch: int, start_position: int, tokens, q_ids=None, q_probs=None
) -> tuple[bytes, int]:
    """(serialized NaiveFrame, payload bytes): tokens as packed uint32 and, if
    given, per token the top-k ids as packed uint32 and probs as packed float32.
    Payload bytes are the tokens and q fields (tags included), without epoch
    and position.
    """
    frame, payload = _naive_frame(epoch, start_position, tokens, q_ids, q_probs)
    return frame.SerializeToString(), payload


# -------------------------------------------------------- the benchmark


def _positions(rng: np.random.Generator, blocks: int, draft_len: int) -> list[tuple[int, int]]:
    """(epoch, start_position) per block: sessions of BLOCKS_PER_SESSION blocks."""
    out = []
    for b in range(blocks):
        if b % BLOCKS_PER_SESSION == 0:
            epoch, position = 0, int(rng.integers(64, 512))
        out.append((epoch, position))
        accepted = int(rng.binomial(draft_len, 0.7))
        verdict = Verdict(epoch, position, accepted, token=0, bonus=accepted == draft_len, done=False)
        position += accepted + 1
        epoch = next_epoch(epoch, verdict)
    return out


def run_wire_bench(
    vocab_size: int = 262144,
    draft_len: int = DEFAULT_DRAFT_LEN,
    draft_top_k: int = DEFAULT_DRAFT_TOP_K,
    prob_bits: int = DEFAULT_PROB_BITS,
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
        totals[name] += (payload, framed_size(message), http2_framed_size(message))

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
                drafted[mode].append(proposals[mode].token)
            q_tilde.append(proposals["rejection"].q)
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
        frame, payload = _naive_frame(epoch, start, drafted["rejection"], naive_ids, naive_probs)
        add("naive", payload, frame.ByteSize())
        frame, payload = _naive_frame(epoch, start, drafted["greedy"])
        add("naive_tokens", payload, frame.ByteSize())

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


# -------------------------------------------------------- a real drafter's q


def recorded_drafter(
    path: str | None,
    *,
    temperature: float = DEFAULT_TEMPERATURE,
    top_k: int = DEFAULT_TOP_K,
    top_p: float = DEFAULT_TOP_P,
    positions: int = 512,
) -> tuple[int, Callable[[int], np.ndarray]]:
    """Run a real GGUF drafter over a text once; replay its processed q per position (cyclically).

    ``path`` is a GGUF file, or None / ``"default"`` for Gemma 3 270M.
    Returns (vocab_size, drafter hook for `run_wire_bench`). q is kept as its
    top 256 candidates, which is all that q̃ (top-k <= 256) and the coupled
    proposal ever look at. The one place here that loads a model; llama.cpp
    is imported only when it is called.
    """
    from edge.drafter_choice import open_llama_drafter

    drafter = open_llama_drafter(None if path == "default" else path, n_threads=None)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    prompt = drafter.vocab.tokenize("Write a detailed essay about the history of the printing press and its effects on Europe.")
    recorded = []
    try:
        drafter.begin(prompt, params)
        for i in range(positions):
            logits = drafter.next_logits()
            recorded.append(top_candidates(logits, params, limit=256))
            drafter.commit([propose(logits, params, len(prompt) + i).token])
        vocab_size = drafter.vocab_size
    finally:
        drafter.close()

    def hook(position: int) -> np.ndarray:
        ids, probs = recorded[position % len(recorded)]
        q = np.zeros(vocab_size)
        q[ids] = probs
        return q

    return vocab_size, hook


# -------------------------------------------------------- the report


def format_wire_report(result: dict, tablefmt: str = "simple") -> str:
    """A table of bytes per drafted token, with ratios to the floor and to naive.

    ``result`` is what `run_wire_bench` returns; ``tablefmt`` is any tabulate
    format ("simple" for a terminal, "pipe" for Markdown).
    """
    floor = result["floor_bytes_per_token"]
    naive = result["naive"]

    def cells(label: str, payload: float, framed: float, http2: float, reference: float | None) -> list[str]:
        return [
            label,
            f"{payload:.3f}",
            f"{framed:.3f}",
            f"{http2:.3f}",
            f"{framed / floor:.2f}x",
            "" if reference is None else f"{reference / framed:.2f}x",
        ]

    rows = []
    for mode in MODES:
        row = result["modes"][mode]
        reference = (
            naive["framed_bytes_per_token"]
            if mode == "rejection"
            else naive["tokens_only_framed_bytes_per_token"]
        )
        rows.append(cells(mode, row["payload_bytes_per_token"], row["framed_bytes_per_token"],
                          row["http2_framed_bytes_per_token"], reference))
    rows.append(cells("naive q", naive["payload_bytes_per_token"], naive["framed_bytes_per_token"],
                      naive["http2_framed_bytes_per_token"], None))
    rows.append(cells("naive ids", naive["tokens_only_payload_bytes_per_token"],
                      naive["tokens_only_framed_bytes_per_token"],
                      naive["tokens_only_http2_framed_bytes_per_token"], None))
    table = tabulate(
        rows,
        headers=["mode", "payload", "framed", "+http2", "vs floor", "naive/ours"],
        tablefmt=tablefmt,
        colalign=["left"] + ["right"] * 5,
        disable_numparse=True,  # cells are formatted already
    )
    return "\n".join([
        f"V={result['vocab']}  D={result['draft_len']}  floor={floor:.3f} B/token (log2 V / 8)",
        table,
        "bytes per drafted token; framed = EdgeFrame + 5-byte gRPC prefix, +http2 adds a 9-byte "
        "DATA frame header; naive q = packed uint32 ids + float32 top-k probs + tokens "
        "(rejection's reference), naive ids = packed uint32 tokens (greedy/coupled's)",
    ])
