"""What one session costs the link, as the edge measures it.

Counts every byte of every gRPC message each way (``shared.wire.framed_size``),
the round-trip time of each block net of the cloud's own processing (the
verdict's ``server_us``), and one ``BlockTiming`` per verify round. Counters
only: no I/O, and no judgement of what a verdict says.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from edge.report import BlockTiming
from protos import splitspec_pb2 as pb
from shared.verdict import stale_forward_ran
from shared.wire import message_wire_bytes

__all__ = ["LinkMeter", "SentBlock"]


@dataclass(eq=False)  # compared by identity: the early block is found again in the queue
class SentBlock:
    """A block sent and not yet answered."""

    at: float  # perf_counter at send
    start_position: int
    drafts: int
    up_bytes: int  # its Draft frame on the wire


@dataclass
class LinkMeter:
    bytes_up: int = 0
    bytes_down: int = 0
    open_bytes: int = 0  # framed bytes of the Opens among ``bytes_up`` (all of them: first, resumes, reopens)
    prompt_tokens: int = 0  # prompt tokens the Opens uploaded
    open_s: float = 0.0  # the first Open sent -> its Opened received (prefill included)
    first_token_cloud_s: float = 0.0  # the cloud's time to the first token, prefill included (0: not with the Opened)
    rtt_samples_s: list[float] = field(default_factory=list)  # [verdicts received that answer a block]
    unasked: int = 0  # verdicts that answered no block (``Verdict.unasked``: the final one, at most): no round trip
    block_log: list[BlockTiming] = field(default_factory=list)  # [blocks verified]

    def count_up(self, frame: pb.EdgeFrame) -> None:
        size = message_wire_bytes(frame)
        self.bytes_up += size
        if frame.WhichOneof("kind") == "open":
            self.open_bytes += size

    def count_down(self, frame: pb.CloudFrame) -> None:
        self.bytes_down += message_wire_bytes(frame)

    def answered(self, sent: SentBlock | None, verdict: pb.Verdict, arrived: float, down_bytes: int) -> None:
        """``sent``'s round trip and verify round (``round_trip``, ``verified``), answered by ``verdict``;
        nothing for a verdict that answers no block (None: ``Verdict.unasked``)."""
        if sent is None:
            self.unasked += 1
            return
        self.round_trip(sent, verdict, arrived)
        self.verified(sent, verdict, down_bytes)

    def round_trip(self, sent: SentBlock, verdict: pb.Verdict, arrived: float) -> None:
        """``sent``'s round trip, answered by ``verdict`` at perf_counter ``arrived``, net of the cloud's time."""
        self.rtt_samples_s.append(max(arrived - sent.at - verdict.server_us * 1e-6, 0.0))

    def verified(self, sent: SentBlock, verdict: pb.Verdict, down_bytes: int) -> None:
        """Log the verify round of ``sent`` (``down_bytes``: what ``verdict`` cost the downlink), unless
        its verdict needed no forward."""
        if verdict.stale:  # answered without its drafts: a token decoded (after rebased drafts), or no forward
            committed = len(verdict.rebased) + verdict.HasField("token")
            forward_tokens = verdict.rebased_verified + 1 if stale_forward_ran(committed, verdict.ahead) else 0
        elif not sent.drafts:  # an empty block: one token, wherever it was asked for, after the cloud's proposals
            forward_tokens = verdict.rebased_verified + 1
        else:  # drafts before the verdict's start were already committed: not in the forward
            forward_tokens = sent.drafts + 1 - max(verdict.start_position - sent.start_position, 0)
        if forward_tokens:
            self.block_log.append(
                BlockTiming(forward_tokens=forward_tokens, cloud_s=verdict.server_us * 1e-6, up_bytes=sent.up_bytes,
                            down_bytes=down_bytes)
            )

    @property
    def rtt_ms(self) -> float:
        """Median round trip net of the cloud's processing, in ms (0 before any block)."""
        return 1e3 * statistics.median(self.rtt_samples_s) if self.rtt_samples_s else 0.0
