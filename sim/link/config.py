"""An emulated link's configuration and timing, pure: what ``sim.link.emulator`` does I/O around.

``DirectionConfig`` and ``LinkConfig`` describe each direction (rate,
segment, overhead, delay, jitter, loss, faults); ``schedule_segment`` says when
a segment leaves and arrives; ``parse_rate`` and ``parse_duration`` read
human units ("50kbit", "100ms"). No I/O, no clock.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import random
import re

__all__ = ["BurstStalls", "DirectionConfig", "LinkConfig", "parse_duration", "parse_rate", "schedule_segment"]

# ---------------------------------------------------------------- parsing

_RATE_UNITS = {  # multiplier to bits per second
    "": 1,
    "bit": 1,
    "bps": 1,
    "kbit": 1_000,
    "kbps": 1_000,
    "mbit": 1_000_000,
    "mbps": 1_000_000,
    "gbit": 1_000_000_000,
    "gbps": 1_000_000_000,
}
_DURATION_UNITS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Zµ]*)\s*$")


def parse_rate(value: str | int | float) -> int:
    """Bits per second from `"50kbit"`, `"10 Mbit"`, `"1.5mbps"`, `"64000"`.

    Units (case-insensitive, SI decimal): `bit`/`bps`, `kbit`/`kbps`,
    `mbit`/`mbps`, `gbit`/`gbps`; all of them are *bits* per second. Note that
    `tc` reads `kbps` as kilobytes; here it means kilobits, as in link
    marketing. A plain number is bits per second; 0 means unlimited.
    Raises ValueError on anything else.
    """
    if isinstance(value, bool):
        raise ValueError(f"rate must be a number or a string like '50kbit', got {value!r}")
    if isinstance(value, (int, float)):
        bps = float(value)
    elif isinstance(value, str):
        m = _NUMBER_UNIT.match(value)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _RATE_UNITS:
            raise ValueError(
                f"bad rate {value!r}: expected a number with an optional unit "
                f"({', '.join(u for u in _RATE_UNITS if u)}), e.g. '50kbit'"
            )
        bps = float(m.group(1)) * _RATE_UNITS[unit]
    else:
        raise ValueError(f"rate must be a number or a string like '50kbit', got {value!r}")
    if not math.isfinite(bps) or bps < 0:
        raise ValueError(f"bad rate {value!r}: must be finite and >= 0")
    return round(bps)


def parse_duration(value: str | int | float) -> float:
    """Seconds from `"50ms"`, `"250us"`, `"1.5s"`; a bare int/float is seconds.

    Strings need a unit (`us`, `ms`, `s`) so that `"50"` cannot silently mean
    50 seconds. Raises ValueError on anything else or on negative values.
    """
    if isinstance(value, bool):
        raise ValueError(f"duration must be a number or a string like '50ms', got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        m = _NUMBER_UNIT.match(value)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _DURATION_UNITS:
            raise ValueError(
                f"bad duration {value!r}: expected a number with a unit (us, ms, s), e.g. '50ms'"
            )
        seconds = float(m.group(1)) * _DURATION_UNITS[unit]
    else:
        raise ValueError(f"duration must be a number or a string like '50ms', got {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"bad duration {value!r}: must be finite and >= 0")
    return seconds


def _human_rate(bps: float) -> str:
    for unit, mult in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= mult:
            return f"{bps / mult:g}{unit}"
    return f"{bps:g}bit"


# ---------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True)
class DirectionConfig:
    """One direction of the emulated link."""

    rate_bps: int = 0  # bits/s on the wire, headers included; 0 = unlimited
    delay_s: float = 0.0  # one-way propagation delay, seconds
    jitter_s: float = 0.0  # jitter amplitude, seconds (see jitter_dist)
    jitter_dist: str = "uniform"  # "uniform": U(-j, +j); "normal": N(0, j); clipped at 0 delay
    loss: float = 0.0  # probability per segment of a retransmission stall, [0, 1)
    rto_s: float = 0.2  # stall per lost segment, seconds
    segment_bytes: int = 1448  # max payload bytes per emulated segment (MSS)
    overhead_bytes: int = 52  # header bytes charged per segment (TCP/IP + timestamps)
    queue_bytes: int = 256 * 1024  # emulator buffer beyond the bandwidth-delay product, bytes
    # Burst stalls (a handover, a radio fade): bursts of ``stall_s`` begin at exponential intervals of mean
    # ``stall_every_s`` (seeded); what is due during one arrives as it ends. 0: none.
    stall_every_s: float = 0.0
    stall_s: float = 0.0

    def __post_init__(self) -> None:
        if self.rate_bps < 0:
            raise ValueError(f"rate_bps must be >= 0, got {self.rate_bps}")
        for name in ("delay_s", "jitter_s", "rto_s", "stall_every_s", "stall_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {v}")
        if self.jitter_dist not in ("uniform", "normal"):
            raise ValueError(f"jitter_dist must be 'uniform' or 'normal', got {self.jitter_dist!r}")
        if not 0.0 <= self.loss < 1.0:
            raise ValueError(f"loss must be in [0, 1), got {self.loss}")
        if self.segment_bytes < 1 or self.overhead_bytes < 0 or self.queue_bytes < 1:
            raise ValueError("segment_bytes and queue_bytes must be >= 1, overhead_bytes >= 0")

    def describe(self) -> str:
        """Short human summary, e.g. '50kbit/s 50ms±2ms loss 0.0%'."""
        rate = "unlimited" if not self.rate_bps else f"{_human_rate(self.rate_bps)}/s"
        jitter = f"±{self.jitter_s * 1e3:g}ms" if self.jitter_s else ""
        stalls = f", stalls {self.stall_s * 1e3:g}ms every ~{self.stall_every_s:g}s" if self.stalls else ""
        return f"{rate} {self.delay_s * 1e3:g}ms{jitter} loss {self.loss:.1%}{stalls}"

    @property
    def stalls(self) -> bool:
        return self.stall_every_s > 0 and self.stall_s > 0

    @property
    def effective_rate_bps(self) -> float:
        """Payload bits/s with full segments: rate * seg / (seg + overhead); 0 = unlimited."""
        return self.rate_bps * self.segment_bytes / (self.segment_bytes + self.overhead_bytes)

    def window_bytes(self) -> int:
        """Most bytes one connection may hold in this direction before reading pauses."""
        rate = self.rate_bps or 1_000_000_000  # unlimited: size the window as for 1 Gbit/s
        in_flight_s = (self.delay_s + 3 * self.jitter_s + (self.rto_s if self.loss else 0.0)
                       + (self.stall_s if self.stalls else 0.0))
        return self.queue_bytes + math.ceil(rate * in_flight_s / 8)


@dataclasses.dataclass(frozen=True)
class LinkConfig:
    """Both directions plus faults. The default is a transparent link."""

    up: DirectionConfig = dataclasses.field(default_factory=DirectionConfig)  # client -> upstream
    down: DirectionConfig = dataclasses.field(default_factory=DirectionConfig)  # upstream -> client
    cut_after_s: float | None = None  # abort all open connections this long after start()
    cut_after_bytes: int | None = None  # abort a connection after this many bytes, up + down
    seed: int = 0  # seeds jitter and loss

    @property
    def rtt_s(self) -> float:
        """Configured propagation round trip, seconds (no serialization, no jitter)."""
        return self.up.delay_s + self.down.delay_s


# ---------------------------------------------------------------- timing math


class BurstStalls:
    """One direction's burst stalls (``DirectionConfig.stall_every_s``, ``stall_s``), drawn from ``seed``
    as time goes on: ``held(t)`` is when something due at ``t`` arrives (the burst's end, inside one)."""

    def __init__(self, cfg: DirectionConfig, seed: int) -> None:
        self.cfg = cfg
        self._rng = random.Random(seed)
        self._bursts: list[tuple[float, float]] = []  # (start, end), in order

    def held(self, t: float) -> float:
        cfg = self.cfg
        if not cfg.stalls:
            return t
        if not self._bursts:  # the first burst, a draw after the first thing sent
            start = t + self._rng.expovariate(1 / cfg.stall_every_s)
            self._bursts.append((start, start + cfg.stall_s))
        while self._bursts[-1][1] <= t:  # bursts up to ``t``
            start = self._bursts[-1][1] + self._rng.expovariate(1 / cfg.stall_every_s)
            self._bursts.append((start, start + cfg.stall_s))
        i = bisect.bisect_right(self._bursts, (t, math.inf)) - 1
        return self._bursts[i][1] if i >= 0 and self._bursts[i][0] <= t < self._bursts[i][1] else t

    @property
    def bursts(self) -> tuple[tuple[float, float], ...]:
        """The bursts drawn so far, as (start, end), in order."""
        return tuple(self._bursts)



def schedule_segment(
    cfg: DirectionConfig,
    n_bytes: int,
    now: float,
    link_free_at: float,
    prev_delivery: float,
    rng: random.Random,
    stalls: BurstStalls | None = None,
) -> tuple[float, float, bool]:
    """Timing of one segment: returns (link_free_at', deliver_at, lost).

    The segment starts serializing at max(now, link_free_at), holds the link
    for (n_bytes + overhead) * 8 / rate, then propagates delay + jitter, plus
    rto if lost, then waits out a burst stall it would arrive in (``stalls``); delivery never
    precedes `prev_delivery` (no reordering).
    `rng` is consulted for jitter only when jitter_s > 0 and for loss only
    when loss > 0.
    """
    start = max(now, link_free_at)
    if cfg.rate_bps > 0:
        free_at = start + (n_bytes + cfg.overhead_bytes) * 8 / cfg.rate_bps
    else:
        free_at = start
    jitter = 0.0
    if cfg.jitter_s > 0:
        if cfg.jitter_dist == "normal":
            jitter = rng.gauss(0.0, cfg.jitter_s)
        else:
            jitter = rng.uniform(-cfg.jitter_s, cfg.jitter_s)
    lost = cfg.loss > 0 and rng.random() < cfg.loss
    propagation = max(0.0, cfg.delay_s + jitter) + (cfg.rto_s if lost else 0.0)
    arrival = free_at + propagation
    if stalls is not None:
        arrival = stalls.held(arrival)
    return free_at, max(prev_delivery, arrival), lost


# ---------------------------------------------------------------- I/O
