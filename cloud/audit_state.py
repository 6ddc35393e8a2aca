"""A rejection-mode session's draft audit: the checks of ``shared.draft_audit`` with their state.

``check_sampled`` refuses drafts that are not the token their q̃ yields under
the session's DRAFT noise, before any forward; ``add_surprise`` adds the
scores of the drafts verification examined to the session's CUSUM and ends
the session past its threshold. Both raise ``ForgedDraft``.
"""

from __future__ import annotations

import numpy as np

from cloud.pending_block import ForgedDraft, PendingBlock
from shared import draft_audit

__all__ = ["DraftAuditState"]


class DraftAuditState:
    """One session's audit: on unless a test's control turns it off."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.cusum = 0.0  # the CUSUM statistic, nats
        self.audited = 0  # drafts scored

    def check_sampled(self, block: PendingBlock, seed: int) -> np.ndarray | None:
        """Refuse ``block``'s drafts unless each is the token its q̃ yields under ``seed``'s DRAFT noise
        (``draft_audit.audit_block``); else their scores [n] (None: nothing to audit)."""
        if block.q is None or not self.enabled or not block.drafts:
            return None
        audit = draft_audit.audit_block(block.drafts, block.q, seed, block.start_position)
        if audit.unsampled is not None:
            raise ForgedDraft(f"{draft_audit.NOT_SAMPLED} (position {block.start_position + audit.unsampled})",
                              "unsampled")
        return audit.scores

    def add_surprise(self, block: PendingBlock, scores: np.ndarray) -> None:
        """Add ``scores`` [k] (the drafts of ``block`` verification examined) to the CUSUM; refuse past
        its threshold."""
        self.cusum, crossed = draft_audit.cusum(self.cusum, scores)
        self.audited += len(scores)
        if crossed is not None:
            raise ForgedDraft(
                f"{draft_audit.IMPROBABLE}: their surprise exceeds what the q̃ imply by {self.cusum:.1f} "
                f"nats (limit {draft_audit.THRESHOLD:.1f}) at position {block.start_position + crossed}",
                "improbable",
            )
