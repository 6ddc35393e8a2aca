"""Sampling parameters of one generation session, shared by edge and cloud."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from shared.sparse import DEFAULT_PROB_BITS, DEFAULT_TOP_K, MAX_PROB_BITS

__all__ = ["Mode", "SamplingParams"]


class Mode(str, enum.Enum):
    """The three lossless verification modes (see DESIGN.md)."""

    GREEDY = "greedy"  # temperature 0: accept while draft == argmax p
    COUPLED = "coupled"  # shared-noise exponential race; token-identical to target-only
    REJECTION = "rejection"  # speculative sampling against the sparse quantized q̃


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen. ``p`` and ``q`` are both processed with these.

    ``top_k == 0`` and ``top_p == 1.0`` switch those filters off. Greedy mode
    forces temperature 0; temperature 0 in another mode behaves as greedy.
    """

    mode: Mode = Mode.COUPLED
    temperature: float = 0.7
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    draft_top_k: int = DEFAULT_TOP_K  # rejection: max support of q̃
    prob_bits: int = DEFAULT_PROB_BITS  # rejection: q̃ weights sum to 2**prob_bits

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode(self.mode))
        if self.mode is Mode.GREEDY:
            object.__setattr__(self, "temperature", 0.0)
        if not (self.temperature >= 0.0 and self.temperature < float("inf")):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.seed < 1 << 64:
            raise ValueError(f"seed must be in [0, 2**64), got {self.seed}")
        if self.draft_top_k < 1:
            raise ValueError(f"draft_top_k must be >= 1, got {self.draft_top_k}")
        if not 1 <= self.prob_bits <= MAX_PROB_BITS:
            raise ValueError(f"prob_bits must be in [1, {MAX_PROB_BITS}], got {self.prob_bits}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def sends_q(self) -> bool:
        """Whether draft blocks carry q̃ (rejection mode, temperature > 0)."""
        return self.mode is Mode.REJECTION and not self.is_greedy
