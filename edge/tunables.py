"""The adaptive schedule's constants (``edge.controller``), in one frozen record."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TUNABLES", "Tunables"]


@dataclass(frozen=True)
class Tunables:
    """The controller's constants, in one place (each measured or argued in ``docs/history.md``).

    ``hysteresis``: how much faster the other side of drafting / the cloud alone must be predicted to
    be swapped to (and hedging switched). ``change_tie``: how much faster another draft length must be
    predicted to be taken; ``window_tie``: windows predicted this close count as equally fast.
    ``min_samples_to_leave_cloud``: acceptance samples (shadow ones included) before drafting again.
    ``evidence_to_draft_less``: drafting less asks for a gap of (1 + margin) * (1 + this / acceptance
    samples) for shorter blocks, and (1 + margin) * (1 + (this / samples)^2) for none (5 on one
    sample, 1.04 on ten): one unlucky first block must not hand a useful drafter to the cloud or to
    short blocks. ``min_window``: blocks in flight the controller chooses at least (it never goes
    lock-step; a session starts with the whole window). ``start_draft_len``: the draft length the first plan weighs others
    against (the cap where lower; a first chain of this length was measured, no faster).
    ``shadow_every``: a drafter slower than half the cloud's pace is measured on every this many
    tokens of a cloud stretch. ``shrink_strength``: pseudo-trials at the pooled rate that a
    position's acceptance estimate is shrunk by. ``start_chain_tokens``: a session starts with the
    cloud decoding alone where one round trip costs more of its tokens than a good drafter's chain
    commits between corrections, 1 / (1 - α) at α 0.85 (the default drafter's measured rate): every
    correction costs a drafting chain a round trip, and the cloud alone pays none, so no drafting
    start keeps pace there (docs/pipelining.md, the start; a drafter that does is still found by the
    shadow proposals). Only where the verifier decodes nothing ahead: where it does, a correction's
    round trip is spent decoding (``Controller.start``)."""

    hysteresis: float = 0.15
    change_tie: float = 0.03
    window_tie: float = 0.01
    min_samples_to_leave_cloud: int = 24
    evidence_to_draft_less: float = 2.0
    min_window: int = 2
    start_draft_len: int = 4
    shadow_every: int = 4
    shrink_strength: float = 4.0
    start_chain_tokens: float = 1 / (1 - 0.85)


TUNABLES = Tunables()
