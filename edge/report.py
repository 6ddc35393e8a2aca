"""What one edge generation measured, as typed records that cross process boundaries.

``splitspec-edge run|baseline --json`` prints an ``EdgeReport``; the
simulation runner and the performance-model fit read it back with
``EdgeReport.from_json`` and use attributes, never string keys.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from edge.drafter import DrafterStats
from shared.stats import DecodeStats

__all__ = ["BlockTiming", "EdgeReport", "Recovery", "SPLIT", "CLOUD_ONLY"]

SPLIT = "split"  # drafted on the edge, verified in the cloud
CLOUD_ONLY = "cloud-only"  # the cloud decoded every token (the baseline)


@dataclass(frozen=True)
class BlockTiming:
    """One verify round as the edge saw it (a cloud-only token is a round of one)."""

    forward_tokens: int  # tokens in the cloud's forward: drafts + 1
    cloud_s: float  # the cloud's own time on it (``server_us``)
    up_bytes: int  # framed bytes of the Draft frame (0 for a cloud-only token)
    down_bytes: int  # framed bytes of the Verdict (or GenerateChunk)

    @property
    def drafts(self) -> int:
        return self.forward_tokens - 1


@dataclass
class Recovery:
    """One broken stream the edge recovered from (``edge.grpc_verifier.GrpcVerifier.resume``)."""

    reconnect_s: float  # the break noticed -> the session back (Opened), backoff and retries included
    attempts: int  # streams tried
    reopened: bool  # the cloud had lost the session: reopened on the committed tokens (a new prefill)
    missed_tokens: int  # tokens the cloud committed in verdicts the cut lost (learned on resuming)
    up_bytes: int  # framed bytes the recovery sent (its Open frames)
    recover_s: float = 0.0  # the break noticed -> the first verdict after it (0: none came)


@dataclass
class EdgeReport:
    """One generation, measured on the edge. Byte counts are ``shared.wire.framed_size`` sums."""

    kind: str  # SPLIT or CLOUD_ONLY
    tokens: list[int]  # [generated] ids, prompt excluded
    text: str
    stop_reason: str
    prompt_tokens: int
    wall_s: float  # first request to last token, link setup and teardown excluded
    ttft_s: float
    open_s: float  # Open sent -> Opened received, the cloud's prefill included (0 for cloud-only)
    ttft_cloud_s: float  # of ttft_s, the cloud's own time (prefill included; 0: the cloud did not say)
    bytes_up: int
    bytes_down: int
    rtt_ms: float  # median round trip net of the cloud's time (0 for cloud-only)
    decode: DecodeStats = field(default_factory=DecodeStats)  # target_forwards: as the cloud reported them
    drafter: DrafterStats = field(default_factory=DrafterStats)
    blocks: list[BlockTiming] = field(default_factory=list)  # [rounds], with --timings only
    switches: int = 0  # adaptive schedule: switches between drafting and the cloud decoding alone
    recoveries: list[Recovery] = field(default_factory=list)  # broken streams recovered from
    error: str = ""  # set when the generation failed: ``tokens`` holds what it made before
    target: str = ""  # the target weights' fingerprint that served it, hex (pin it with --pin-target)

    def to_json(self) -> dict:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["decode"] = self.decode.to_json()
        out["drafter"] = self.drafter.to_json()
        out["blocks"] = [asdict(b) for b in self.blocks]
        out["recoveries"] = [asdict(r) for r in self.recoveries]
        return out

    @classmethod
    def from_json(cls, data: dict) -> EdgeReport:
        """The inverse of ``to_json``; ``ValueError`` names a missing or malformed field."""
        try:
            fields = {name: data[name] for name in cls.__dataclass_fields__ if name not in _ADDED}
            fields.update({name: data.get(name, default) for name, default in _ADDED.items()})
            fields["decode"] = DecodeStats.from_json(data["decode"])
            fields["drafter"] = DrafterStats.from_json(data["drafter"])
            fields["blocks"] = [BlockTiming(**b) for b in data["blocks"]]
            fields["recoveries"] = [Recovery(**r) for r in data["recoveries"]]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not an edge report: {exc!r}") from exc
        return cls(**fields)


_ADDED = {"target": ""}  # fields reports written before them lack (read as their default)
