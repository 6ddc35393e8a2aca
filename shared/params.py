"""Sampling parameters of one generation session, shared by edge and cloud,
and the product's defaults: every command line and benchmark reads them here.

``temperature`` and ``top_p`` cross the wire as 32-bit floats, so a
``SamplingParams`` holds them rounded through float32 once: the edge, the
in-process reference and the networked cloud all compute ``p`` and ``q`` with
the very same number.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from shared.sparse import DEFAULT_PROB_BITS as SPARSE_DEFAULT_PROB_BITS
from shared.sparse import DEFAULT_TOP_K as SPARSE_DEFAULT_TOP_K
from shared.sparse import MAX_PROB_BITS

__all__ = [
    "Mode",
    "TOKEN_IDENTICAL_MODES",
    "SamplingParams",
    "DEFAULT_TEMPERATURE",
    "DEFAULT_TOP_K",
    "DEFAULT_TOP_P",
    "DEFAULT_DRAFT_LEN",
    "SCHEDULES",
    "DEFAULT_SCHEDULE",
    "DEFAULT_WINDOW",
    "window_for",
    "DEFAULT_DRAFT_TOP_K",
    "DEFAULT_PROB_BITS",
    "as_float32",
    "NUMERICS",
]

DEFAULT_TEMPERATURE = 0.7
MIN_TEMPERATURE = 1e-3  # below this (but above 0), logits / T overflows float32: use 0 for greedy
DEFAULT_TOP_K = 64  # Gemma 3's recommendation; 0 = off
DEFAULT_TOP_P = 0.95  # 1.0 = off
DEFAULT_DRAFT_LEN = 8  # drafts per block D (0 = target-only)
# lockstep: one block at a time; pipelined: up to a window of blocks in flight; adaptive: pipelined, with
# the draft length (0 = the cloud decodes alone) chosen from what the session measures.
SCHEDULES = ("lockstep", "pipelined", "adaptive")
DEFAULT_SCHEDULE = "pipelined"
DEFAULT_WINDOW = 4  # blocks in flight when pipelined (adaptive: at most)
DEFAULT_DRAFT_TOP_K = SPARSE_DEFAULT_TOP_K  # rejection: support of q̃
DEFAULT_PROB_BITS = SPARSE_DEFAULT_PROB_BITS  # rejection: q̃ weights sum to 2**bits


def window_for(schedule: str, window: int | None) -> int:
    """Blocks in flight for a schedule: 1 in lock-step, ``window`` otherwise (None: ``DEFAULT_WINDOW``; the
    adaptive schedule's cap is then what the link can use, ``edge.link_windows.drafting_window_for``, and
    this is where it starts before a round trip is known)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose from {', '.join(SCHEDULES)}")
    if window is None:
        window = DEFAULT_WINDOW
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    return 1 if schedule == "lockstep" else window


def as_float32(value: float) -> float:
    """``value`` as the wire's 32-bit float carries it (NaN and inf pass through)."""
    return float(np.float32(value))


class Mode(str, enum.Enum):
    """The three lossless verification modes (see DESIGN.md)."""

    GREEDY = "greedy"  # temperature 0: accept while draft == argmax p
    COUPLED = "coupled"  # shared-noise exponential race; token-identical to target-only
    REJECTION = "rejection"  # speculative sampling against the sparse quantized q̃


# Modes whose output equals target-only decoding token for token (rejection: in distribution only).
TOKEN_IDENTICAL_MODES = frozenset({Mode.GREEDY.value, Mode.COUPLED.value})


NUMERICS = ("auto", "reproducible")  # a session as opened by default (free shapes when alone), or reproducible


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen. ``p`` and ``q`` are both processed with these.

    The defaults are the product's. ``top_k == 0`` and ``top_p == 1.0``
    switch those filters off. Greedy mode forces temperature 0; temperature 0
    in another mode behaves as greedy. ``temperature`` and ``top_p`` are held
    rounded through float32 (what the wire carries).
    """

    mode: Mode = Mode.COUPLED
    temperature: float = DEFAULT_TEMPERATURE
    top_k: int = DEFAULT_TOP_K
    top_p: float = DEFAULT_TOP_P
    seed: int = 0
    draft_top_k: int = DEFAULT_DRAFT_TOP_K  # rejection: max support of q̃
    prob_bits: int = DEFAULT_PROB_BITS  # rejection: q̃ weights sum to 2**prob_bits
    reproducible: bool = False  # logits bit-identical at any batch composition (canonical shapes on the verifier)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode(self.mode))
        object.__setattr__(self, "temperature", as_float32(self.temperature))
        object.__setattr__(self, "top_p", as_float32(self.top_p))
        if self.mode is Mode.GREEDY:
            object.__setattr__(self, "temperature", 0.0)
        if not (self.temperature >= 0.0 and self.temperature < float("inf")):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if 0.0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {self.temperature:g}")
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
