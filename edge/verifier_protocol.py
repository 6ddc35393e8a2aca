"""What the decode loop asks of a verifier connection, and what a generation returns.

A ``VerifierConnection`` is answered in-process (``sim.inprocess``) or over gRPC
(``edge.grpc_verifier``); ``edge.decode_loop`` drives one through a generation. The
errors say whether the verifier refused the request (``bad_input``) or the link
broke and the session may be resumed (``LinkLost``).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

from edge.drafter import DraftBlock
from shared.params import SamplingParams
from shared.stats import DecodeStats
from shared.verdict import StopReason, Verdict
from shared.wire import StreamHints

__all__ = ["VerifierConnection", "LinkHint", "ServedBy", "SessionTerms", "Resumption", "GenerationResult", "ProtocolError",
           "VerifierError", "LinkLost", "CloudTiming", "Received"]


class ProtocolError(RuntimeError):
    """The verifier answered something that does not fit the blocks we sent."""


class VerifierError(RuntimeError):
    """The cloud could not be reached, refused us, or went away for good.

    ``bad_input``: the cloud refused what we asked for (a status that says the
    request was wrong), so a command line exits 2, not 1. ``partial``: what
    ``run_decode`` had generated when it failed (set by ``run_decode``).
    """

    def __init__(self, message: str, bad_input: bool = False) -> None:
        super().__init__(message)
        self.bad_input = bad_input
        self.partial: GenerationResult | None = None


class LinkLost(VerifierError):
    """The stream to the verifier broke or went silent; the session may be resumed."""


@dataclass(frozen=True)
class LinkHint:
    """What the edge knows of the link and the cloud before its Open (``VerifierConnection.link_hint``):
    a measured round trip with no cloud work in it, and what the cloud's stream headers said (its
    pace decoding alone, its blocks in flight)."""

    round_trip_s: float
    cloud: StreamHints = StreamHints()


@dataclass(frozen=True)
class CloudTiming:
    """What the cloud measured of one verdict (its ``server_us``, ``forward_us``, ``forward_rows``)."""

    cloud_s: float = 0.0  # the cloud's own time for the verdict
    forward_s: float = 0.0  # ... of that, the forward that answered it (0: none, or not said)
    forward_rows: int = 0  # the session's rows in that forward (0: the same, or more than one forward)


@dataclass(frozen=True)
class Received:
    """A verdict as it arrived, with what the cloud measured of it (``VerifierConnection.receive``)."""

    verdict: Verdict
    timing: CloudTiming = CloudTiming()


@dataclass(frozen=True)
class ServedBy:
    """Who serves a session (its ``Opened``): the verifier replica, and the target weights' fingerprint."""

    replica: str = ""
    target_fingerprint: bytes = b""


@dataclass(frozen=True)
class SessionTerms:
    """What the verifier allows a session (its ``Opened``)."""

    max_draft_len: int  # drafts per block (the loop asks for window - 1 more: guesses for stale blocks' tokens)
    max_blocks_in_flight: int  # blocks with drafts sent and not yet answered
    answers_first_position: bool = False  # a verdict for the first position comes unasked (an empty block)
    max_branches: int = 0  # hedge branches a block may carry
    kept_early_block: bool = False  # the block drafted while the Open was in flight went out and fits these terms
    row_tile: int = 0  # rows the verifier's forwards cost alike (Opened.row_tile; 0: not said)
    head_start: int = 0  # empty blocks sent behind the Open that stand, for the positions after the first
    max_empty_blocks: int = 1  # empty blocks one frame may stand for (Opened.max_empty_blocks; 1: an older verifier)

    @property
    def empty_in_flight(self) -> int:
        """Empty blocks the session may have in flight (a cloud stretch's window): ``max_empty_blocks``
        where the verifier says more than one a frame (it bounds them apart from those with drafts, or
        counts every block against ``max_blocks_in_flight`` and says no more than that), else
        ``max_blocks_in_flight`` (an older verifier)."""
        return self.max_empty_blocks if self.max_empty_blocks > 1 else self.max_blocks_in_flight


@dataclass(frozen=True)
class Resumption:
    """The verifier's state after a broken stream, which the edge adopts (``VerifierConnection.resume``)."""

    terms: SessionTerms
    epoch: int  # the session's epoch: blocks go out at it
    missed: list[int]  # tokens the verifier committed past the edge's (verdicts lost in the cut)
    stop_reason: StopReason = StopReason.NONE  # not NONE: the session had ended; ``missed`` holds its last tokens
    reopened: bool = False  # the session was gone: a new one was opened on the committed tokens


class VerifierConnection(Protocol):
    """One generation session with a verifier, wherever it runs.

    Every block sent gets exactly one verdict, in order; one drafted at an
    epoch older than the session's, or that does not continue the committed
    tokens, gets a stale one (``Verdict.stale``).
    """

    forwards: int  # target forwards the verifier reports for this session, prefill included
    link_hint: LinkHint | None  # what is known of the link before the Open (None: nothing)

    def open(self, prompt: Sequence[int], params: SamplingParams, max_new_tokens: int, max_draft_len: int,
             early_block: Future | None = None, head_start: int = 0, pipelined: bool = False) -> SessionTerms:
        """Start a session for ``prompt``; returns what the verifier allows.

        ``early_block``: resolves (on another thread) to a (block, more_follows) for the position
        after the first, which the verifier answers unasked; it is sent if it is ready before the
        Opened arrives, and ``kept_early_block`` says whether it went and stands (it fits the
        session's draft length: the verifier drops one that does not). ``head_start`` (instead):
        this many empty blocks for the positions after the first, sent right behind the Open, so
        the cloud decodes on alone from its prefill without waiting a round trip for them;
        ``SessionTerms.head_start`` says how many went (none when the Open had to be sent again).
        ``pipelined``: the edge keeps more than one block in flight, so the verifier may decode ahead of
        its next block after a correction (``cloud.decode_ahead``); a lock-step edge's next block comes
        a round trip after each verdict by design, and is verified as sent."""

    def send(self, epoch: int, start_position: int, block: DraftBlock, more_follows: bool, *,
             empty_blocks: int = 1) -> None:
        """Queue one block for verification (returns at once); an empty ``block`` with ``empty_blocks``
        > 1 stands for that many at consecutive positions, each answered by a verdict of its own
        (within ``SessionTerms.max_empty_blocks``)."""

    def receive(self) -> Received:
        """The next verdict with its timing (blocks until it arrives); ``LinkLost`` when the stream broke."""

    def ready(self) -> bool:
        """Whether ``receive`` would return (or raise) without waiting: a verdict, or the news that
        the stream broke, has arrived."""

    def resume(self, committed: Sequence[int]) -> Resumption:
        """After ``LinkLost``: the same session on a new stream, or, when it is gone, a new one opened
        on ``committed`` (prompt included). Blocks sent before are forgotten. Raises
        ``VerifierError`` when the verifier stays out of reach."""

    def close(self) -> None:
        """End the session."""


@dataclass
class GenerationResult:
    tokens: list[int]  # generated ids, prompt excluded
    stop_reason: StopReason
    stats: DecodeStats = field(default_factory=DecodeStats)
    ttft_s: float = 0.0  # time from start to the first committed token
