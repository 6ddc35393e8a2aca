"""What one verify step answered and what it cost: the record a ``VerifierSession`` step returns.

The caller (``cloud.block_stream``, ``sim.inprocess``) reads a step's rows and
seconds from here, never from fields left on the session.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.verdict import Verdict

__all__ = ["StepResult"]


@dataclass(frozen=True)
class StepResult:
    """One verify step of one session (``VerifierSession.verify_chain_steps``)."""

    verdicts: list[Verdict] = field(default_factory=list)  # [blocks answered], in order
    rows: int = 0  # rows this session put in its forward (0: it ran none)
    proposed: int = 0  # ... of them, drafts the cloud proposed itself (no client's)
    proposals_taken: int = 0  # ... and how many of those it committed
    drafts: int = 0  # the client's drafts and branch tokens the forward fed, every block of the chain's
    seconds: float = 0.0  # the step's wall time: forward, verification and sampling

    @property
    def client_rows(self) -> int:
        """The rows the client's own drafts cost (what its share is charged)."""
        return self.rows - self.proposed

    @property
    def drafts_accepted(self) -> int:
        """Of ``drafts``, those the step committed (a chain's blocks past a correction fed rows and
        committed none: they count as drafted, never as accepted)."""
        taken = sum(v.accepted + len(v.rebased) + (1 + v.branch_accepted if v.branch else 0)
                    - min(v.ahead, v.accepted + len(v.rebased)) for v in self.verdicts)  # (decoded ahead: no drafts)
        return taken - self.proposals_taken

    @property
    def client_tokens(self) -> int:
        """Tokens the step committed that the cloud's own proposals did not bring."""
        return sum(verdict.committed_count for verdict in self.verdicts) - self.proposals_taken
