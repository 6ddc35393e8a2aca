"""The split decoder with no network: an edge drafter and a cloud verifier in one process.

``LocalVerifier`` answers the edge loop's ``VerifierConnection`` by calling a
``cloud.session.VerifierSession`` directly, so ``generate`` runs exactly the
code the networked path runs, minus the wire.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cloud.engine import TargetEngine
from cloud.session import VerifierSession
from edge.decode_loop import GenerationResult, run_decode
from edge.drafter import DraftBlock, Drafter
from shared.params import SamplingParams
from shared.verdict import Verdict

__all__ = ["LocalVerifier", "generate"]


class LocalVerifier:
    """``VerifierConnection`` over an in-process ``VerifierSession``."""

    def __init__(self, engine: TargetEngine) -> None:
        self.engine = engine
        self.session: VerifierSession | None = None

    @property
    def forwards(self) -> int:
        return self.session.forwards if self.session is not None else 0

    def open(self, prompt: Sequence[int], params: SamplingParams, max_new_tokens: int, max_draft_len: int) -> int:
        self.session = VerifierSession(
            self.engine, prompt, params, max_new_tokens=max_new_tokens, max_draft_len=max_draft_len
        )
        return max_draft_len

    def verify(self, epoch: int, start_position: int, block: DraftBlock) -> Verdict:
        assert self.session is not None, "open() first"
        return self.session.verify(epoch, start_position, block.tokens, block.q)

    def close(self) -> None:
        pass


def generate(
    engine: TargetEngine,
    drafter: Drafter,
    prompt: Sequence[int],
    params: SamplingParams,
    *,
    max_new_tokens: int,
    draft_len: int,
    on_tokens: Callable[[list[int]], None] | None = None,
) -> GenerationResult:
    """Split decoding in one process; ``draft_len`` 0 is target-only decoding."""
    return run_decode(
        drafter, LocalVerifier(engine), prompt, params, max_new_tokens=max_new_tokens, draft_len=draft_len,
        on_tokens=on_tokens,
    )
