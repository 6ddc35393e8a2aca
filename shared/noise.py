"""Counter-based noise: randomness as a pure function of its coordinates.

``U(seed, position, token, purpose)`` is a uniform in (0, 1) computed by a
SplitMix64-style hash of the four integers. There is no generator state, so
the edge and the cloud agree on every draw without talking, and a resumed or
replayed session sees exactly the same noise.

Arithmetic is int64 with wraparound and logical right shifts done by masking,
so the torch port in ``cloud.verify_torch`` yields bit-identical integers.
"""

from __future__ import annotations

import enum

import numpy as np

__all__ = ["Purpose", "hash_counters", "uniform", "uniform_bits", "exponential"]


class Purpose(enum.IntEnum):
    """Independent noise streams. Never reuse one stream for two decisions."""

    SAMPLE = 1  # target sample (coupled race, bonus tokens, target-only decoding)
    DRAFT = 2  # drafter's sample from q̃ in rejection mode
    ACCEPT = 3  # accept/reject coin in rejection mode
    RESIDUAL = 4  # sample from norm(max(0, p - q̃)) after a rejection


def _as_int64(value: int) -> np.int64:
    """Reinterpret a Python int modulo 2**64 as a signed int64."""
    value &= (1 << 64) - 1
    if value >= 1 << 63:
        value -= 1 << 64
    return np.int64(value)


# SplitMix64 constants, as signed int64.
GOLDEN = _as_int64(0x9E3779B97F4A7C15)
MIX1 = _as_int64(0xBF58476D1CE4E5B9)
MIX2 = _as_int64(0x94D049BB133111EB)
# Odd multipliers that spread the four coordinates apart before mixing.
K_POSITION = _as_int64(0xD1B54A32D192ED03)
K_TOKEN = _as_int64(0xAEF17502108EF2D9)
K_PURPOSE = _as_int64(0x8CB92BA72F3D8DD7)

_MASK = {s: _as_int64((1 << (64 - s)) - 1) for s in (11, 27, 30, 31)}


def _shr(x: np.ndarray, s: int) -> np.ndarray:
    """Logical right shift of int64 values."""
    return (x >> s) & _MASK[s]


def _mix(x: np.ndarray) -> np.ndarray:
    x = (x ^ _shr(x, 30)) * MIX1
    x = (x ^ _shr(x, 27)) * MIX2
    return x ^ _shr(x, 31)


def hash_counters(seed: int, position, token, purpose: int) -> np.ndarray:
    """64-bit hash of (seed, position, token, purpose) as int64; broadcasts.

    ``position`` and ``token`` may be ints or integer arrays; the result has
    their broadcast shape.
    """
    with np.errstate(over="ignore"):
        key = _mix(np.asarray(_as_int64(seed), dtype=np.int64) + GOLDEN)
        x = key + np.asarray(position, dtype=np.int64) * K_POSITION
        x = _mix(x)
        x = x + np.asarray(token, dtype=np.int64) * K_TOKEN + _as_int64(int(purpose)) * K_PURPOSE
        return _mix(x)


def uniform_bits(seed: int, position, token, purpose: int, bits: int) -> np.ndarray:
    """Uniform integers in [0, 2**bits) (bits <= 53), from the hash's top bits."""
    if not 1 <= bits <= 53:
        raise ValueError(f"bits must be in [1, 53], got {bits}")
    h = hash_counters(seed, position, token, purpose)
    return _shr(h, 11) >> (53 - bits)


def uniform(seed: int, position, token, purpose: int) -> np.ndarray:
    """U in the open interval (0, 1), float64, 53 bits of the hash."""
    top = uniform_bits(seed, position, token, purpose, 53)
    return (top.astype(np.float64) + 0.5) * (1.0 / (1 << 53))


def exponential(seed: int, position, token, purpose: int) -> np.ndarray:
    """E = -ln U: a standard exponential per (position, token)."""
    return -np.log(uniform(seed, position, token, purpose))
