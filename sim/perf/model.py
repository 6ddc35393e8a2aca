"""Performance model of split decoding: predicted tokens/s, TTFT, bytes and cloud work.

Contract. Pure arithmetic on explicit inputs (`Timings`, `NetworkModel`, a draft
length), no I/O: hardware profiles are read by `sim.perf.hardware_profile`.
A lock-step round (``predict_split``; pipelined chains are followed block by block,
``predict_pipelined`` and ``sim.perf.block_sim``) is

    draft D tokens on the edge      D * t_draft
    send one Draft frame up         serialization + expected loss stall
    propagation both ways           rtt
    one target forward over D+1     t_verify(D+1) = fixed + per_token * (D+1)
    send one Verdict frame down     serialization + expected loss stall

and commits AL(D) tokens on average (`expected_acceptance_length`), so
tokens/s = AL / round. Cloud-only decoding runs one forward per token and
streams each token down in its own message; the link limits it only when the
downlink cannot carry one chunk per forward.

Link arithmetic follows the emulator (`sim.link.emulator`): a message of n payload
bytes occupies ceil(n / segment) segments, each charged `overhead_bytes` of
TCP/IP headers; TCP ACKs are not charged (the emulator relays bytes, it does
not carry the acks); a lost segment costs an `rto_s` stall. Jitter is taken
as zero-mean and ignored. Burst stalls (a scenario's `stall_every`/`stall`: a
handover, a fade) are not modelled: a stall of s seconds every T on average
costs a stream up to about s / T of its time, which a prediction for such a
scenario leaves out (`sim.perf.fit` lists both as not modelled). For cloud-only streaming a stall delays delivery but
not the forwards behind it, so loss moves TTFT, not throughput. Messages are
assumed not to coalesce into shared segments (conservative on slow links).

Byte counts (`Timings.up_bytes_*`, `down_bytes_*`) are TCP payload bytes:
protobuf plus the 5-byte gRPC prefix plus the 9-byte HTTP/2 DATA frame header,
as the emulator's byte counters see them. HTTP/2 control frames (WINDOW_UPDATE,
PING) are not in the protocol defaults; fit them from measured runs instead.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from edge.controller import Controller
from edge.early_block import EARLY_DRAFT_LEN
from edge.link_windows import CLOUD_WINDOW
from shared.acceptance import expected_acceptance_length
from shared.wire import http2_framed_size
from sim.perf.block_sim import BlockCosts, SimulatedRun, simulate_adaptive, simulate_pipelined

__all__ = [
    "NetworkModel",
    "Prediction",
    "Timings",
    "best_draft_len",
    "expected_acceptance_length",
    "fit_linear",
    "predict_cloud_only",
    "predict_split",
    "predict_pipelined",
    "predict_adaptive",
    "best_adaptive",
    "fastest_then_cheapest",
    "first_token_s",
    "protocol_bytes",
]

# ---------------------------------------------------------------- link


@dataclasses.dataclass(frozen=True)
class NetworkModel:
    """The link as the model sees it. Rates in bits/s on the wire; 0 = unlimited."""

    up_bps: float  # edge -> cloud
    down_bps: float  # cloud -> edge
    rtt_s: float  # propagation round trip (up delay + down delay), seconds
    segment_bytes: int = 1448  # max payload bytes per segment (MSS)
    overhead_bytes: int = 52  # TCP/IP header bytes charged per segment
    loss: float = 0.0  # probability per segment of a retransmission stall (up; down too unless set)
    rto_s: float = 0.2  # stall per lost segment (up; down too unless set), seconds
    down_loss: float | None = None  # downlink loss when it differs from `loss`
    down_rto_s: float | None = None  # downlink stall when it differs from `rto_s`

    @classmethod
    def from_link_config(cls, cfg: Any) -> NetworkModel:
        """From a `sim.link.config.LinkConfig` (segment size and overhead taken from the up direction)."""
        return cls(
            up_bps=cfg.up.rate_bps,
            down_bps=cfg.down.rate_bps,
            rtt_s=cfg.up.delay_s + cfg.down.delay_s,
            segment_bytes=cfg.up.segment_bytes,
            overhead_bytes=cfg.up.overhead_bytes,
            loss=cfg.up.loss,
            rto_s=cfg.up.rto_s,
            down_loss=cfg.down.loss,
            down_rto_s=cfg.down.rto_s,
        )

    def segments(self, n_bytes: float) -> int:
        """Segments one message of `n_bytes` payload occupies (0 for an empty message)."""
        return math.ceil(n_bytes / self.segment_bytes) if n_bytes > 0 else 0

    def serialization_s(self, n_bytes: float, rate_bps: float) -> float:
        """(n + segments * overhead) * 8 / rate; 0 on an unlimited link."""
        if rate_bps <= 0:
            return 0.0
        return (n_bytes + self.segments(n_bytes) * self.overhead_bytes) * 8 / rate_bps

    def up_s(self, n_bytes: float) -> float:
        """Expected time one message holds the uplink: serialization plus loss stalls."""
        return self.serialization_s(n_bytes, self.up_bps) + self.loss * self.segments(n_bytes) * self.rto_s

    def down_s(self, n_bytes: float) -> float:
        """Expected time one message holds the downlink: serialization plus loss stalls."""
        loss = self.loss if self.down_loss is None else self.down_loss
        rto = self.rto_s if self.down_rto_s is None else self.down_rto_s
        return self.serialization_s(n_bytes, self.down_bps) + loss * self.segments(n_bytes) * rto


# ---------------------------------------------------------------- timings


@dataclasses.dataclass(frozen=True)
class Timings:
    """What the model needs to know about the models, the machines and the protocol."""

    draft_s_per_token: float  # edge drafter time per drafted token, Python included
    verify_fixed_s: float  # t_verify(n) = verify_fixed_s + verify_per_token_s * n
    verify_per_token_s: float
    alpha_per_position: list[float]  # [measured positions] P(draft i accepted | drafts < i accepted)
    up_bytes_fixed: float  # Draft frame bytes on the TCP link, fixed part (gRPC/HTTP2 included)
    up_bytes_per_draft: float  # ... plus this per drafted token
    down_bytes_per_round: float  # one Verdict frame
    down_bytes_per_token_cloud_only: float  # one GenerateChunk frame (one token)
    prefill_s: float = 0.0  # cloud forward over the prompt at session open (TTFT only)
    draft_prefill_s: float = 0.0  # edge drafter reading the prompt, before its first block (split only)
    open_up_bytes: float = 0.0  # Open / GenerateRequest frame, prompt included (TTFT only)
    # One-token forward when measured apart: CPU BLAS runs 1-row products on another
    # kernel (matrix-vector), so t_verify(1) need not lie on the line through n >= 2.
    verify_one_s: float | None = None
    # A stale block's forward (the cloud decodes while the next chain's block is on its way):
    # the rebased drafts it verifies (sent for those positions before the correction was known),
    # and how many of them it accepts, on average; 0 with --stale-blocks decode or rejection mode.
    rebased_verified_per_stale_decode: float = 0.0
    rebased_per_stale_decode: float = 0.0
    # How often a chain's first block guessed the tokens decoded for a stale block right, when measured
    # (None: with the first draft's acceptance, as in coupled mode, where drafter and target share the
    # noise; rejection mode's guesses are independent).
    stale_decode_guess_hit: float | None = None
    # The verifier lets such a forward run past the next block's due time where the guesses' odds make it
    # pay (``cloud.next_block.stale_decode_overrun_pays``): greedy and coupled modes; False for rejection mode.
    stale_decode_overruns: bool = True

    def verify_s(self, n_tokens: float) -> float:
        """Target forward time over `n_tokens` new tokens (D drafts + the pending token)."""
        if n_tokens == 1 and self.verify_one_s is not None:
            return self.verify_one_s
        return self.verify_fixed_s + self.verify_per_token_s * n_tokens

    @property
    def stale_decode_s(self) -> float:
        """A stale block's forward: the next token's (``verify_s(1)``, measured apart where it can be),
        plus the line's cost per row for the rebased drafts it verifies (none for a falling line)."""
        return self.verify_s(1) + max(self.verify_per_token_s, 0.0) * self.rebased_verified_per_stale_decode

    def up_bytes(self, draft_len: int) -> float:
        return self.up_bytes_fixed + self.up_bytes_per_draft * draft_len


def fit_linear(samples: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares line through (x, y) samples: returns (intercept, slope).

    Used for t_verify from (tokens_in_forward, seconds) and for uplink bytes
    from (drafts_in_block, bytes). With a single distinct x there is no slope
    to fit: returns (mean y, 0.0). ValueError on no samples.
    """
    if not samples:
        raise ValueError("fit_linear needs at least one sample")
    x = np.asarray([s[0] for s in samples], dtype=np.float64)  # [n]
    y = np.asarray([s[1] for s in samples], dtype=np.float64)  # [n]
    if np.unique(x).size < 2:
        return float(y.mean()), 0.0
    design = np.stack([np.ones_like(x), x], axis=1)  # [n, 2]
    (intercept, slope), *_ = np.linalg.lstsq(design, y, rcond=None)
    return float(intercept), float(slope)


# ---------------------------------------------------------------- predictions


@dataclasses.dataclass(frozen=True)
class Prediction:
    """Modelled steady state of one configuration (draft_len 0 = cloud-only)."""

    draft_len: int
    tokens_per_s: float
    round_s: float  # one round (split) or one token (cloud-only), seconds
    acceptance_length: float  # tokens committed per round (1 for cloud-only)
    cloud_s_per_token: float  # target compute seconds per generated token
    ttft_s: float  # request sent on an open channel -> first token at the edge
    up_bytes_per_token: float  # TCP payload bytes per generated token
    down_bytes_per_token: float
    # seconds per round: draft, uplink, rtt, verify, downlink; they add up to round_s for split,
    # while for cloud-only verify and downlink overlap and round_s is the larger
    breakdown: dict[str, float]

    @property
    def limit(self) -> str:
        """The largest term of the breakdown: what this configuration waits on most."""
        return max(self.breakdown, key=self.breakdown.__getitem__)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["limit"] = self.limit
        return d


def predict_split(timings: Timings, link: NetworkModel, draft_len: int) -> Prediction:
    """Non-pipelined split decoding with blocks of `draft_len` drafts (0 = target-only over the split protocol)."""
    if draft_len < 0:
        raise ValueError(f"draft length must be >= 0, got {draft_len}")
    al = expected_acceptance_length(timings.alpha_per_position, draft_len) if draft_len else 1.0
    up_bytes = timings.up_bytes(draft_len)
    breakdown = {
        "draft": draft_len * timings.draft_s_per_token,
        "uplink": link.up_s(up_bytes),
        "rtt": link.rtt_s,
        "verify": timings.verify_s(draft_len + 1),
        "downlink": link.down_s(timings.down_bytes_per_round),
    }
    round_s = sum(breakdown.values())
    return Prediction(
        draft_len=draft_len,
        tokens_per_s=al / round_s if round_s > 0 else math.inf,
        round_s=round_s,
        acceptance_length=al,
        cloud_s_per_token=breakdown["verify"] / al,
        ttft_s=first_token_s(timings, link, timings.down_bytes_per_round),
        up_bytes_per_token=up_bytes / al,
        down_bytes_per_token=timings.down_bytes_per_round / al,
        breakdown=breakdown,
    )


def first_token_s(timings: Timings, link: NetworkModel, first_message_bytes: float) -> float:
    """Request sent -> first token at the edge: the request up, the RTT, the prefill (whose last
    row gives the first token, in cloud-only and split decoding alike), the first message down."""
    return link.up_s(timings.open_up_bytes) + link.rtt_s + timings.prefill_s + link.down_s(first_message_bytes)


STEADY_GENERATION_TOKENS = 256  # a generation long enough for the steady state (generation_tokens None)
SIMULATED_TOKENS = 16_384  # tokens each pipelined prediction follows, over at least 32 generations (runs differ
# by a few % at most: what guesses do rests on a few events a generation)
ADAPTIVE_SIMULATED_TOKENS = 8_192  # ... each adaptive one (its controller's arithmetic costs more than the blocks)


def predict_pipelined(timings: Timings, link: NetworkModel, draft_len: int, window: int,
                      decode_stale: bool = True, generation_tokens: int | None = None) -> Prediction:
    """Split decoding with up to `window` blocks of `draft_len` drafts in flight (window 1: lock-step).

    Followed block by block over whole generations (``sim.perf.block_sim``): the edge drafts on
    from its unverified blocks while the window allows and reads a verdict once it is full, the
    verifier takes every block pending when it starts a forward, a correction voids the blocks in
    flight past it, and the cloud answers those stale blocks with tokens it decodes while the
    next chain's first block, drafted on guesses of them, is on its way (``decode_stale`` False:
    a verifier run with ``--stale-blocks drop``). The guesses hold as often as measured
    (``Timings.stale_decode_guess_hit``), or with the first draft's acceptance. The early block
    (``edge.early_block``) is in flight when the first token arrives. ``generation_tokens``: the
    tokens one generation makes (None: a long one, ``STEADY_GENERATION_TOKENS``); the rate is
    from each generation's first token to its last.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if window == 1 or draft_len == 0:
        return predict_split(timings, link, draft_len)
    tokens = max(generation_tokens or STEADY_GENERATION_TOKENS, 2)
    costs = _block_costs(timings, link, draft_len, decode_stale)
    return _simulated(timings, link, simulate_pipelined(costs, draft_len, window, tokens, max(32, SIMULATED_TOKENS // tokens)))


def _block_costs(timings: Timings, link: NetworkModel, max_draft_len: int, decode_stale: bool = True) -> BlockCosts:
    """What a block costs where, for the block simulation; a forward over more rows never costs less."""
    def forward_s(rows: int) -> float:
        return timings.verify_s(1) if rows == 1 else timings.verify_s(2) + max(timings.verify_per_token_s, 0.0) * (rows - 2)

    return BlockCosts(
        alpha=timings.alpha_per_position or [0.0], draft_s=timings.draft_s_per_token,
        up_s=lambda drafts: link.up_s(timings.up_bytes(drafts)), rtt_s=link.rtt_s,
        down_s=link.down_s(timings.down_bytes_per_round), forward_s=forward_s, stale_decode_s=timings.stale_decode_s,
        rebased_per_stale_decode=timings.rebased_per_stale_decode, decode_stale=decode_stale,
        early_drafts=min(max_draft_len, EARLY_DRAFT_LEN), stale_decode_overruns=timings.stale_decode_overruns,
        # Both hold in greedy and coupled modes, where a draft is accepted exactly when it is the target's token.
        guess_trials=timings.stale_decode_overruns, token_guessed=timings.stale_decode_guess_hit,
    )


def _simulated(timings: Timings, link: NetworkModel, run: SimulatedRun) -> Prediction:
    """A prediction from a block simulation's totals; its draft length is the mean drafts (guesses apart)
    of the blocks sent with any (0: none), its breakdown one such block's terms (the chain overlaps them)."""
    drafted = run.sent - run.empty
    draft_len = round((run.sent_drafts - run.guesses) / drafted) if drafted else 0
    verified = max(run.verdicts - run.stale, 1)
    latency = {
        "uplink": link.up_s(timings.up_bytes(draft_len)),
        "rtt": link.rtt_s,
        "verify": timings.verify_s(draft_len + 1),
        "downlink": link.down_s(timings.down_bytes_per_round),
    }
    return Prediction(
        draft_len=draft_len,
        tokens_per_s=run.tokens_per_s,
        round_s=run.seconds / verified,
        acceptance_length=run.tokens / verified,
        cloud_s_per_token=run.cloud_s / run.tokens,
        ttft_s=first_token_s(timings, link, timings.down_bytes_per_round),
        up_bytes_per_token=(run.sent * timings.up_bytes_fixed + run.sent_drafts * timings.up_bytes_per_draft) / run.tokens,
        down_bytes_per_token=run.verdicts * timings.down_bytes_per_round / run.tokens,
        breakdown={"draft": draft_len * timings.draft_s_per_token, **latency},
    )


SPEED_TIE = 0.01  # predictions this close count as equally fast


def fastest_then_cheapest(predictions: list[Prediction]) -> Prediction:
    """The prediction fastest; among those within ``SPEED_TIE`` of it, the one with the least cloud
    compute per token (then the shortest block)."""
    best = max(p.tokens_per_s for p in predictions)
    return min((p for p in predictions if p.tokens_per_s * (1 + SPEED_TIE) >= best),
               key=lambda p: (p.cloud_s_per_token, p.draft_len))


def predict_adaptive(timings: Timings, link: NetworkModel, max_draft_len: int, window: int,
                     generation_tokens: int | None = None) -> Prediction:
    """The adaptive schedule as a session runs it: each generation under a fresh controller
    (``edge.controller``, as ``edge.controller.controller_for`` makes one) that learns from the
    simulated verdicts, block by block (``sim.perf.block_sim.simulate_adaptive``): its first
    chains on its priors, its switches to the cloud decoding alone and back, its choices where its
    closed-form arithmetic misjudges (stale blocks on a long round trip). That is what a session
    gets, not the best configuration (``best_adaptive``)."""
    tokens = max(generation_tokens or STEADY_GENERATION_TOKENS, 2)
    costs = _block_costs(timings, link, max_draft_len)
    run = simulate_adaptive(costs, lambda: Controller(max_draft_len, window, CLOUD_WINDOW), tokens,
                            max(32, ADAPTIVE_SIMULATED_TOKENS // tokens))
    return _simulated(timings, link, run)


def best_adaptive(timings: Timings, link: NetworkModel, max_draft_len: int, window: int,
                  generation_tokens: int | None = None) -> Prediction:
    """The adaptive schedule's ceiling: the faster of pipelined chains with D = 1..max_draft_len and
    the cloud decoding alone."""
    options = [predict_pipelined(timings, link, d, window, generation_tokens=generation_tokens)
               for d in range(1, max_draft_len + 1)]
    return max([*options, _cloud_alone(timings, link)], key=lambda p: p.tokens_per_s)


def _cloud_alone(timings: Timings, link: NetworkModel) -> Prediction:
    """The cloud decoding alone over the split protocol: cloud-only's rate, an empty Draft frame up a token."""
    alone = predict_cloud_only(timings, link)
    up = timings.up_bytes(0)
    return dataclasses.replace(alone, up_bytes_per_token=up, breakdown={**alone.breakdown, "uplink": link.up_s(up)})


def predict_cloud_only(timings: Timings, link: NetworkModel) -> Prediction:
    """The target generates every token and streams each one down in its own message.

    Steady state: one token per max(t_verify(1), downlink serialization of one
    chunk). The first token waits for the request, the RTT and the prefill.
    """
    chunk = timings.down_bytes_per_token_cloud_only
    verify = timings.verify_s(1)
    downlink = link.serialization_s(chunk, link.down_bps)
    per_token = max(verify, downlink)
    return Prediction(
        draft_len=0,
        tokens_per_s=1.0 / per_token if per_token > 0 else math.inf,
        round_s=per_token,
        acceptance_length=1.0,
        cloud_s_per_token=verify,
        ttft_s=first_token_s(timings, link, chunk),
        up_bytes_per_token=0.0,
        down_bytes_per_token=chunk,
        breakdown={"draft": 0.0, "uplink": 0.0, "rtt": 0.0, "verify": verify, "downlink": downlink},
    )


def best_draft_len(timings: Timings, link: NetworkModel, max_d: int = 16) -> int:
    """The D in 1..max_d with the highest predicted tokens/s (the smallest on ties)."""
    if max_d < 1:
        raise ValueError(f"max_d must be >= 1, got {max_d}")
    return max(range(1, max_d + 1), key=lambda d: (predict_split(timings, link, d).tokens_per_s, -d))


# ---------------------------------------------------------------- protocol bytes

def protocol_bytes(vocab_size: int) -> dict[str, float]:
    """Our protocol's TCP payload bytes per message (greedy/coupled), from `protos/splitspec.proto`.

    Draft: EdgeFrame tag+length (2) + epoch (2) + start_position (3, positions
    128..16383) + payload tag+length (2) + ceil(D * bits / 8) packed ids, where
    bits = ceil(log2 V); the ceil adds half a byte on average. Verdict: 18
    bytes of protobuf (epoch, position, accepted, token, server_us; the
    forward count rides on the final verdict only). Chunk: 2 bytes of
    protobuf around one packed id. Each message adds
    ``shared.wire.http2_framed_size(0)`` = 14 bytes of framing. Rejection mode's q̃ adds to the per-draft bytes; set them from
    `splitspec bench wire` or a measured run.
    """
    bits = max(1, (vocab_size - 1).bit_length())
    return {
        "up_fixed": http2_framed_size(9) + 0.5,
        "up_per_draft": bits / 8,
        "down_per_round": http2_framed_size(18),
        "down_per_token_cloud_only": http2_framed_size(2 + math.ceil(bits / 8)),
    }
