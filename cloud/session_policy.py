"""What the service does for a session beyond verifying its blocks: a frozen record.

Set from ``ServiceLimits`` and the session's ``Open`` (``cloud.handshake``);
a session replaces it, never edits it (a new turn's proposals, fair share's
penalty).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SessionPolicy"]


@dataclass(frozen=True)
class SessionPolicy:
    """A session's terms beyond its drafts per block (``cloud.draft_limit``)."""

    max_branches: int = 0  # hedge branches a block may carry (greedy and coupled modes)
    decode_stale: bool = True  # a stale block with no usable block behind it gets the next token (False: answered empty)
    rebase_stale: bool = True  # ... and that forward verifies the drafts sent past a correction (greedy, coupled)
    propose: bool = False  # the edge takes the cloud's own proposals on an empty block's verdict (Open.takes_proposals)
    decode_ahead: bool = False  # ... and tokens decoded before its next block came (Open.takes_ahead, cloud.decode_ahead)
    tell_end: bool = False  # ... told at once when they end the session, in a verdict no block asked for (Open.takes_unasked_end)
    audit_drafts: bool = True  # rejection mode refuses drafts not sampled from their q̃ (False: tests' controls only)
    # Rows one verify forward may feed (the service's --max-batch-rows; 0: no bound): a chain longer than
    # this is verified across forwards, the blocks past the bound waiting as if they had not arrived yet.
    max_rows: int = 0
    # Rejection mode: the secret its ACCEPT and RESIDUAL coins are keyed on (shared.verify.coin_seed), drawn by the
    # service for every session and never sent; 0 (in-process sessions): the seed alone, coins the edge can compute.
    coin_key: int = 0
