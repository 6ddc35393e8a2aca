"""The split decoder with no network: an edge drafter and a cloud verifier in one process.

``LocalVerifier`` answers the edge loop's ``VerifierConnection`` by calling a
``cloud.session.VerifierSession`` directly, so ``generate`` runs exactly the
code the networked path runs, minus the wire.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence

from cloud.engine import TargetEngine, run_alone
from cloud.limits import ServiceLimits
from cloud.session import PendingBlock, SessionPolicy, VerifierSession
from edge.decode_loop import GenerationResult, Resumption, SessionTerms, SpecConfig, run_decode
from edge.drafter import DraftBlock, Drafter
from edge.verifier_protocol import CloudTiming, LinkHint, Received
from shared.params import SamplingParams

__all__ = ["LocalVerifier", "SpecConfig", "generate"]


class LocalVerifier:
    """``VerifierConnection`` over an in-process ``VerifierSession``.

    Blocks sent are queued; ``receive`` verifies every queued chain at once,
    as the service coalesces what is pending, so ``max_blocks_in_flight``
    blocks can share one forward.
    """

    def __init__(self, engine: TargetEngine, max_blocks_in_flight: int = ServiceLimits.max_blocks_in_flight,
                 max_branches: int = ServiceLimits.max_branches, link_hint: LinkHint | None = None) -> None:
        """``link_hint``: what the decode loop is told of the link before the Open (none is measured here)."""
        self.engine = engine
        self.link_hint = link_hint
        self.max_blocks_in_flight = max_blocks_in_flight
        self.max_branches = max_branches
        self.session: VerifierSession | None = None
        self._pending: list[PendingBlock] = []
        self._verdicts: deque[Received] = deque()

    @property
    def forwards(self) -> int:
        return self.session.forwards if self.session is not None else 0

    def open(self, prompt: Sequence[int], params: SamplingParams, max_new_tokens: int, max_draft_len: int,
             early_block=None, head_start: int = 0, pipelined: bool = False) -> SessionTerms:
        self.session = VerifierSession(
            self.engine, prompt, params, max_new_tokens=max_new_tokens, max_draft_len=max_draft_len,
            policy=SessionPolicy(max_branches=self.max_branches, propose=max_draft_len > 0),
        )
        self._pending.append(PendingBlock(0, len(prompt), []))  # the first position, answered as the service does
        made = early_block.result() if early_block is not None else None
        kept = bool(made) and len(made[0].tokens) <= max_draft_len
        if kept:
            self.send(0, len(prompt) + 1, *made)
        for i in range(head_start):
            self.send(0, len(prompt) + 1 + i, DraftBlock([]), False)
        return SessionTerms(max_draft_len, self.max_blocks_in_flight, answers_first_position=True,
                            max_branches=self.max_branches, kept_early_block=kept,
                            row_tile=self.engine.row_tile(params.reproducible), head_start=head_start,
                            max_empty_blocks=self.max_blocks_in_flight)

    def send(self, epoch: int, start_position: int, block: DraftBlock, more_follows: bool, *,
             empty_blocks: int = 1) -> None:
        self._pending.extend(PendingBlock(epoch, start_position + i, list(block.tokens), block.q, more_follows,
                                          tuple(block.branches)) for i in range(empty_blocks))

    def receive(self) -> Received:
        assert self.session is not None, "open() first"
        while not self._verdicts:
            if not self._pending:
                raise RuntimeError("receive() with no block awaiting a verdict")
            started, forwards = time.perf_counter(), self.session.forwards
            step = run_alone(self.session.verify_chain_steps(self._pending), self.engine)
            seconds = time.perf_counter() - started  # the chain's verify time: nothing waits here
            timing = CloudTiming(seconds, seconds, step.rows if self.session.forwards == forwards + 1 else 0)
            self._verdicts.extend(Received(verdict, timing) for verdict in step.verdicts)
        return self._verdicts.popleft()

    def ready(self) -> bool:
        """Verdicts are made when asked for (``receive``): those of a chain verified together wait here."""
        return bool(self._verdicts)

    def resume(self, committed: Sequence[int]) -> Resumption:
        """The session, as a reattach over the wire finds it: blocks not yet verified are dropped,
        verdicts not yet received are lost, and the tokens they committed are reported as missed."""
        assert self.session is not None, "open() first"
        session = self.session
        if not session.prompt_len <= len(committed) <= len(session.tokens):
            raise ValueError(f"resume from {len(committed)} committed tokens; the session has {len(session.tokens)}")
        self._pending.clear()
        self._verdicts.clear()
        terms = SessionTerms(session.draft_limit.opened, self.max_blocks_in_flight, max_branches=self.max_branches,
                             max_empty_blocks=self.max_blocks_in_flight)
        return Resumption(terms, session.epoch, session.tokens[len(committed) :], session.stop_reason)

    def close(self) -> None:
        self._pending.clear()


def generate(
    engine: TargetEngine,
    drafter: Drafter,
    prompt: Sequence[int],
    params: SamplingParams,
    *,
    max_new_tokens: int,
    spec: SpecConfig,
    on_tokens: Callable[[list[int]], None] | None = None,
) -> GenerationResult:
    """Split decoding in one process, as ``spec`` says (``SpecConfig(0)``: target-only)."""
    return run_decode(drafter, LocalVerifier(engine), prompt, params, max_new_tokens=max_new_tokens,
                      spec=spec, on_tokens=on_tokens)
