"""What an attacker or a broken client sends a verifier: frame factories for the fuzz and the audit's tests.

``HostileFrames`` makes what arrives on a ``Decode`` stream: valid Opens with
fields set to edge-case values, drafts with random payloads, ids, positions and
epochs, zstd bombs, payloads over the codec's limit, messages over gRPC's limit,
bytes that are not protobuf at all, and valid frames with bits flipped; and
forged rejection-mode drafts: well-formed blocks whose tokens were not sampled
from their q̃, garbage at the largest D, and (``ForgingDrafter``) q̃ shaped
around the noise the forger knows, so its token is the draw at a tiny weight.
Pure generators: nothing here sends (``sim.bench.fuzz`` does).
"""

from __future__ import annotations

import random

import numpy as np
from google.protobuf.message import DecodeError

from edge.drafter import DraftBlock, ModelFreeDrafter
from protos import splitspec_pb2 as pb
from shared import codec
from shared.sparse import SparseDist, draft_noise, quantize, sampled_indices
from shared.wire import MAX_MESSAGE_BYTES, sampling_to_proto

__all__ = ["HostileFrames", "ForgingDrafter", "shaped_q", "neutral_q", "CLOSE"]

CLOSE = pb.EdgeFrame(close=pb.Close())
_WEIRD_UINT32 = [0, 1, 4, 64, 1024, 1025, 2**31, 2**32 - 1]
_WEIRD_FLOATS = [0.0, -0.0, -1.0, 1e-310, 1e-30, 1e-6, 1e30, float("inf"), float("nan")]


def shaped_q(want: int, r: int, prob_bits: int, top_k: int, others: list[int]) -> SparseDist:
    """A q̃ shaped around the known DRAFT noise ``r``: ``want`` is what the drafter's sampling rule draws
    (``shared.sparse.sampled_indices``), at the smallest weight a valid wire q̃ allows (weights
    non-increasing, support <= ``top_k``), the rest spread on ``others`` (distinct ids, ``want`` not
    among them, at least ``top_k - 1``) as flat as it goes, so the q̃ looks as likely as it can.

    The sample is the token whose cumulative interval holds r; weights fall along the support, so
    ``want`` at weight w either follows heavier tokens that fill [0, r) (w >= (2^b - r)/(top_k - 1)
    for the rest to fit behind it) or comes first (w > r, w >= 2^b/top_k).
    """
    total = 1 << prob_bits
    if top_k == 1:
        return SparseDist(np.array([want]), np.array([total]), prob_bits)
    after = -(-(total - r) // (top_k - 1))  # want at [r, r + w): heavier tokens before it fill [0, r)
    first = max(r + 1, -(-total // top_k))  # want at [0, w)
    weight, start = (after, r) if 1 <= after <= r and after < first else (first, 0)
    tail = total - start - weight
    least_tail = -(-tail // weight)  # tokens behind want, each <= w
    heads = min(start // weight, top_k - 1 - least_tail) if start else 0
    tails = min(tail, top_k - 1 - heads)
    head_weights = _split(start, heads)
    tail_weights = _split(tail, tails)
    support = [*others[:heads], want, *others[heads : heads + tails]]
    return SparseDist(np.array(support), np.array([*head_weights, weight, *tail_weights]), prob_bits)


def neutral_q(want: int, r: int, prob_bits: int, top_k: int, others: list[int]) -> SparseDist | None:
    """A uniform q̃ over ``top_k`` tokens with ``want`` where ``r`` falls (a forgery no test on q̃ alone
    can see: the draw is exactly as likely as an honest one); None when ``top_k`` does not divide 2^b."""
    total = 1 << prob_bits
    if total % top_k:
        return None
    support = list(others[: top_k - 1])
    support.insert(r // (total // top_k), want)
    return SparseDist(np.array(support), np.full(top_k, total // top_k), prob_bits)


def _split(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` near-equal positive integers, largest first."""
    if not parts:
        return []
    base, extra = divmod(total, parts)
    return [base + 1] * extra + [base] * (parts - extra)


class ForgingDrafter(ModelFreeDrafter):
    """A hostile rejection-mode edge behind the ``Drafter`` lifecycle: at every position it drafts
    ``want(position)`` with a q̃ shaped around the session's DRAFT noise (it knows the seed).

    ``strategy``: ``"shaped"`` gives the token the smallest weight the wire allows at each position
    (``shaped_q``); ``"tail"`` gives it weight <= 2^-8 where the wire allows that and a uniform q̃
    (``neutral_q``) elsewhere. ``weights[position]``: the weight (a fraction) it last drafted there.
    """

    def __init__(self, vocab_size: int, want, strategy: str = "shaped", seed: int = 0) -> None:
        if strategy not in ("shaped", "tail"):
            raise ValueError(f"unknown forging strategy {strategy!r}")
        super().__init__(vocab_size)
        self.want, self.strategy = want, strategy
        self.rng = random.Random(seed)
        self.weights: dict[int, float] = {}

    def propose_block(self, n: int) -> DraftBlock:
        params = self._params
        start = len(self._spec.tokens)
        tokens, q = [], []
        for position in range(start, start + n):
            want = int(self.want(position))
            others = self.rng.sample([t for t in range(self.vocab_size) if t != want], params.draft_top_k)
            r = int(draft_noise(params.seed, position, params.prob_bits))
            dist = shaped_q(want, r, params.prob_bits, params.draft_top_k, others)
            if self.strategy == "tail" and dist.prob(want) > 2.0**-8:
                dist = neutral_q(want, r, params.prob_bits, params.draft_top_k, others) or dist
            tokens.append(want)
            q.append(dist)
            self.weights[position] = dist.prob(want)
        return DraftBlock(tokens, q)

    def low_weight_positions(self, start: int, stop: int) -> int:
        """Positions in [start, stop) where it drafted its token at weight <= 2^-8."""
        return sum(1 for position, w in self.weights.items() if start <= position < stop and w <= 2.0**-8)


class HostileFrames:
    """Random hostile frames for a verifier with vocabulary ``vocab_size`` / ``fingerprint``.

    ``prompt`` is a valid prompt (Opens start from it); ``max_draft_len`` the
    server's block limit. Everything comes from ``rng``: the same seed gives
    the same frames.
    """

    def __init__(self, vocab_size: int, fingerprint: bytes, prompt: list[int], max_draft_len: int,
                 rng: random.Random) -> None:
        self.V, self.fingerprint, self.prompt = vocab_size, fingerprint, list(prompt)
        self.max_draft_len, self.rng = max_draft_len, rng

    @property
    def P(self) -> int:
        return len(self.prompt)

    def valid_open(self, prompt: list[int] | None = None, **fields) -> pb.EdgeFrame:
        """A valid greedy Open for ``prompt`` (default: ours); ``fields`` override any Open field."""
        from shared.params import Mode, SamplingParams

        encoded = codec.encode_tokens(self.prompt if prompt is None else prompt, self.V)
        message = dict(vocab_size=self.V, vocab_fingerprint=self.fingerprint,
                       sampling=sampling_to_proto(SamplingParams(mode=Mode.GREEDY)),
                       prompt=encoded.data, prompt_compressed=encoded.compressed, max_new_tokens=40)
        message.update(fields)
        return pb.EdgeFrame(open=pb.Open(**message))

    def random_open(self) -> pb.EdgeFrame:
        """A valid Open with none, one or a few fields set to random or edge-case values."""
        rng = self.rng
        frame = self.valid_open(self.prompt[: rng.randrange(1, self.P + 1)], max_new_tokens=rng.choice([1, 3, 40]))
        s = frame.open.sampling
        s.CopyFrom(pb.Sampling(mode=rng.choice([pb.MODE_GREEDY, pb.MODE_COUPLED, pb.MODE_REJECTION]),
                               temperature=rng.choice([0.0, 0.7, 1.0]), seed=rng.randrange(2**64)))
        mutations = [
            lambda o: setattr(s, "mode", rng.choice([0, 4, rng.randrange(2**31)])),
            lambda o: setattr(s, "temperature", rng.choice(_WEIRD_FLOATS)),
            lambda o: setattr(s, "top_k", rng.choice([1, 5, self.V, 2**32 - 1])),
            lambda o: setattr(s, "top_p", rng.choice([1e-9, 0.5, 1.5, float("nan"), -1.0])),
            lambda o: setattr(s, "draft_top_k", rng.choice(_WEIRD_UINT32)),
            lambda o: setattr(s, "prob_bits", rng.choice([1, 16, 17, 31, 2**32 - 1])),
            lambda o: setattr(o, "vocab_fingerprint", rng.randbytes(rng.choice([0, 16, 40]))),
            lambda o: setattr(o, "vocab_size", rng.choice(_WEIRD_UINT32)),
            lambda o: setattr(o, "prompt", rng.randbytes(rng.randrange(0, 48))),
            lambda o: setattr(o, "prompt_compressed", True),
            lambda o: setattr(o, "max_new_tokens", rng.choice([0, 4096, 4097, 2**32 - 1])),
            lambda o: setattr(o, "max_draft_len", rng.choice(_WEIRD_UINT32)),
            lambda o: setattr(o, "resume_ticket", rng.randbytes(rng.choice([1, 16]))),
            lambda o: setattr(o, "committed_length", rng.choice([0, 2**64 - 1])),
            lambda o: setattr(o, "extend", True),
        ]
        for mutate in rng.sample(mutations, rng.choice([0, 0, 1, 1, 2, 3])):
            mutate(frame.open)
        return frame

    def random_draft(self) -> pb.EdgeFrame:
        """A draft with random ids (in or out of the vocabulary), payload bytes, position and epoch."""
        rng = self.rng
        pick = rng.random()
        if pick < 0.4:
            n = rng.choice([0, 1, 3, self.max_draft_len, self.max_draft_len + 1])
            encoded = codec.encode_tokens([rng.randrange(self.V) for _ in range(n)], self.V)
            payload, compressed = encoded.data, encoded.compressed
        elif pick < 0.5:  # ids past the vocabulary: pack them at a wider width than token_bits(V)
            wide = codec.encode_tokens([rng.randrange(self.V, 2 * self.V) for _ in range(3)], 2 * self.V)
            payload, compressed = wide.data, wide.compressed
        elif pick < 0.6:
            payload, compressed = self.zstd_bomb(), True
        elif pick < 0.65:
            payload, compressed = bytes(codec.MAX_PAYLOAD_BYTES + rng.randrange(1, 64)), False
        else:
            payload, compressed = rng.randbytes(rng.randrange(0, 64)), rng.random() < 0.5
        return pb.EdgeFrame(draft=pb.Draft(
            epoch=rng.choice([0, 0, 0, 1, 2, 2**64 - 1]),
            start_position=rng.choice([self.P] * 3 + [0, self.P + 1, self.P + 40, 2**64 - 1]),
            payload=payload,
            compressed=compressed,
            more_follows=rng.random() < 0.2,
        ))

    def zstd_bomb(self) -> bytes:
        """A small zstd frame that expands far past the codec's limit."""
        return codec._compressor().compress(bytes(self.rng.choice([1 << 20, 16 << 20])))

    def random_frame(self) -> pb.EdgeFrame:
        """Any frame: random bytes where they parse, an Open, a draft, an empty frame or a Close."""
        rng = self.rng
        if rng.random() < 0.2:
            try:
                return pb.EdgeFrame.FromString(rng.randbytes(rng.randrange(1, 40)))
            except DecodeError:
                pass
        pick = rng.random()
        if pick < 0.15:
            return self.random_open()
        if pick < 0.85:
            return self.random_draft()
        return pb.EdgeFrame() if pick < 0.9 else CLOSE

    def mutated(self, frame: pb.EdgeFrame) -> bytes:
        """``frame`` serialized, then bits flipped, truncated or extended."""
        rng = self.rng
        data = bytearray(frame.SerializeToString())
        pick = rng.random()
        if pick < 0.5 and data:
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif pick < 0.75 and data:
            del data[rng.randrange(len(data)):]
        else:
            data += rng.randbytes(rng.randrange(1, 16))
        return bytes(data)

    def rejection_open(self, seed: int, *, draft_top_k: int = 16, prob_bits: int = 8) -> pb.EdgeFrame:
        """A valid rejection-mode Open (temperature 1) with ``seed``: the noise a forger knows."""
        from shared.params import Mode, SamplingParams

        params = SamplingParams(mode=Mode.REJECTION, temperature=1.0, seed=seed, draft_top_k=draft_top_k,
                                prob_bits=prob_bits)
        return self.valid_open(sampling=sampling_to_proto(params))

    def forged_draft(self, start: int, seed: int, n: int, *, garbage: bool = False, draft_top_k: int = 16,
                     prob_bits: int = 8) -> pb.EdgeFrame:
        """A well-formed rejection-mode block of ``n`` drafts from ``start`` whose tokens were not sampled
        from their q̃: honest-looking q̃ (a quantized random distribution) with another token of the
        support than the one the DRAFT noise draws (``garbage``: random tokens of the support, at
        least one of them not the draw)."""
        rng = self.rng
        q = []
        for _ in range(n):
            ids = np.array(rng.sample(range(self.V), min(self.V, draft_top_k)))
            q.append(quantize(np.random.default_rng(rng.randrange(2**32)).dirichlet(np.ones(ids.size)), draft_top_k,
                              prob_bits, ids=ids))
        drawn = [int(dist.support[i]) for dist, i in zip(q, sampled_indices(q, seed, start))]
        forged = set(range(n)) if not garbage else {rng.randrange(n)}
        tokens = []
        for i, (dist, token) in enumerate(zip(q, drawn)):
            choices = [int(t) for t in dist.support if int(t) != token] or [token]
            tokens.append(rng.choice(choices) if i in forged else int(rng.choice(dist.support.tolist())))
        encoded = codec.encode_draft(tokens, self.V, q, draft_top_k=draft_top_k)
        return pb.EdgeFrame(draft=pb.Draft(epoch=0, start_position=start, payload=encoded.data,
                                           compressed=encoded.compressed))

    def forged_stream(self) -> tuple[list[bytes], int]:
        """A rejection-mode Open, then one to three forged blocks chained from the first position (naive
        forgeries, or garbage at the largest D): (messages, blocks)."""
        rng = self.rng
        seed = rng.randrange(2**63)
        messages = [self.rejection_open(seed).SerializeToString()]
        start, blocks = self.P, rng.randrange(1, 4)
        for _ in range(blocks):
            garbage = rng.random() < 0.5
            n = self.max_draft_len if garbage else rng.randrange(1, self.max_draft_len + 1)
            frame = self.forged_draft(start, seed, n, garbage=garbage)
            frame.draft.more_follows = True
            messages.append(frame.SerializeToString())
            start += n
        return messages, blocks

    def stream(self) -> tuple[list[bytes], str]:
        """One hostile stream: its messages (serialized) and how it ends: ``close`` (Close, then
        half-close), ``half-close``, ``abandon`` (cancelled after its frames) or ``silent``
        (a valid Open, then nothing until the server gives up on it)."""
        rng = self.rng
        ending = rng.choices(["close", "half-close", "abandon", "silent"], weights=[60, 20, 15, 5])[0]
        if ending == "silent":
            return [self.valid_open().SerializeToString()], ending
        messages = [self.random_open().SerializeToString()] if rng.random() < 0.7 else []
        for _ in range(rng.randrange(1, 6)):
            pick = rng.random()
            if pick < 0.1:
                messages.append(rng.randbytes(rng.randrange(1, 64)))  # not protobuf at all
            elif pick < 0.25:
                messages.append(self.mutated(rng.choice([self.valid_open(), self.random_draft()])))
            elif pick < 0.27:
                messages.append(bytes(MAX_MESSAGE_BYTES + 1))  # over gRPC's message limit
            else:
                messages.append(self.random_frame().SerializeToString())
        if ending == "close":
            messages.append(CLOSE.SerializeToString())
        return messages, ending
