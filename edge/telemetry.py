"""The edge's place in the fleet: status, periodic telemetry and commands over MQTT.

``EdgeFleet`` publishes ``edge/{id}/status`` (retained; ``offline`` by will
or on a clean stop) and, every ``period_s``, ``edge/{id}/telemetry``: what
the last generations measured (tokens/s, acceptance per position, D, W,
mode, RTT, bytes), within the client's byte budget. With the fleet's command key
it applies commands from ``edge/{id}/cmd`` (``{"id": ..., "set": {"max_draft_len": n,
"mode": m}, "ts", "sig"}``, signed: ``shared.fleet_commands``; once per id), and
without one it takes none. It follows each verifier replica's suggested draft length
(``cloud/{replica}/load``), which caps the edge's own.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from shared.fleet import DEFAULT_BUDGET_BPS, DEFAULT_TELEMETRY_PERIOD_S, PREFIX, FleetClient
from shared.fleet_commands import verify
from shared.params import Mode

__all__ = ["EdgeFleet", "GenerationSample"]

log = logging.getLogger(__name__)


@dataclass
class GenerationSample:
    """One generation as telemetry sees it."""

    tokens: int
    wall_s: float
    mode: str
    draft_len: int
    window: int
    served_by: str
    replica: str = ""
    rtt_ms: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0
    accepted_at: list[int] = field(default_factory=list)
    drafted_at: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, result, *, mode: str, draft_len: int, window: int, served_by: str, verifier=None) -> GenerationSample:
        """The sample of a ``GenerationResult``; ``verifier`` (a ``GrpcVerifier``): its link figures
        (None when the drafter answered alone)."""
        stats = result.stats
        return cls(
            tokens=len(result.tokens), wall_s=stats.wall_s, mode=mode, draft_len=draft_len, window=window,
            served_by=served_by, replica=verifier.served_by.replica if verifier else "",
            rtt_ms=verifier.rtt_ms if verifier else 0.0, bytes_up=verifier.bytes_up if verifier else 0,
            bytes_down=verifier.bytes_down if verifier else 0, accepted_at=list(stats.accepted_at),
            drafted_at=list(stats.drafted_at),
        )


class EdgeFleet:
    def __init__(self, url: str, edge_id: str, *, period_s: float = DEFAULT_TELEMETRY_PERIOD_S,
                 budget_bps: float = DEFAULT_BUDGET_BPS, listen: bool = True, command_key: bytes | None = None) -> None:
        """``listen`` False: report only (a one-shot run has no later request to steer, so it saves
        the uplink the subscriptions and the retained loads would cost). ``command_key``: the fleet's
        key that commands are signed with (None: no commands are taken)."""
        self.command_key = command_key
        self.client = FleetClient(url, "edge", edge_id, budget_bps=budget_bps,
                                  on_command=self._command if listen and command_key else None)
        if listen:
            self.client.watch(f"{PREFIX}/cloud/+/load", self._cloud_load)
        self.period_s = period_s
        self.max_draft_len: int | None = None  # set by a command
        self.mode: Mode | None = None  # set by a command: the mode of sampled (T > 0) requests
        self.suggested: dict[str, int] = {}  # replica -> its suggested draft length
        self._lock = threading.Lock()
        self._samples: list[GenerationSample] = []
        self._totals = {"generations": 0, "tokens": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._publish_forever, name="edge-telemetry", daemon=True)

    def start(self, **status) -> EdgeFleet:
        self.client.status.update(status)
        self.client.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.client.stop()

    # -- what the service asks -------------------------------------------------
    def draft_len_cap(self, replica: str, draft_len: int) -> int:
        """``draft_len`` capped by a command and by the replica's suggestion."""
        caps = [draft_len, self.max_draft_len or draft_len, self.suggested.get(replica, draft_len)]
        return max(1, min(caps))

    def observe(self, sample: GenerationSample) -> None:
        with self._lock:
            self._samples.append(sample)
            self._totals["generations"] += 1
            self._totals["tokens"] += sample.tokens

    # -- MQTT callbacks (the client's thread) ----------------------------------
    def _command(self, command: dict) -> None:
        verify(command, self.command_key)  # (refused: CommandRefused, logged by the client, not applied)
        settings = command.get("set") or {}
        unknown = set(settings) - {"max_draft_len", "mode"}
        if unknown:
            raise ValueError(f"unknown settings {sorted(unknown)}")
        if "max_draft_len" in settings:
            value = int(settings["max_draft_len"])
            if value < 1:
                raise ValueError(f"max_draft_len must be >= 1, got {value}")
            self.max_draft_len = value
        if "mode" in settings:
            mode = Mode(settings["mode"])
            if mode is Mode.GREEDY:
                raise ValueError("greedy follows from temperature 0; set coupled or rejection")
            self.mode = mode
        log.info("fleet command %s applied: %s", command.get("id"), settings)

    def _cloud_load(self, topic: str, document: dict) -> None:
        replica = topic.split("/")[-2]
        self.suggested[replica] = int(document["suggested_max_draft_len"])

    # -- telemetry ---------------------------------------------------------------
    def flush(self) -> bool:
        """Publish what was observed since the last telemetry message, now."""
        with self._lock:
            samples, self._samples = self._samples, []
            totals = dict(self._totals)
        # Figures are retained (a watcher that subscribes later still sees them); idle beats are not.
        return self.client.publish("telemetry", telemetry_document(samples, totals), retain=bool(samples))

    def _publish_forever(self) -> None:
        while not self._stop.wait(self.period_s):
            self.flush()


def telemetry_document(samples: list[GenerationSample], totals: dict) -> dict:
    """What the period's generations measured (compact: it crosses a thin uplink)."""
    document = {"ts": round(time.time(), 1), **totals, "state": "decoding" if samples else "idle"}
    if not samples:
        return document
    last = samples[-1]
    tokens, wall = sum(s.tokens for s in samples), sum(s.wall_s for s in samples)
    accepted = [sum(s.accepted_at[i] for s in samples if i < len(s.accepted_at))
                for i in range(max(len(s.accepted_at) for s in samples))]
    drafted = [sum(s.drafted_at[i] for s in samples if i < len(s.drafted_at))
               for i in range(max(len(s.drafted_at) for s in samples))]
    document.update({
        "tokens_per_s": round(tokens / wall, 2) if wall else 0.0,
        "alpha_at": [round(a / d, 3) if d else 0.0 for a, d in zip(accepted, drafted)],
        "D": last.draft_len, "W": last.window, "mode": last.mode, "served_by": last.served_by,
        "replica": last.replica, "rtt_ms": round(last.rtt_ms, 1), "hedge_hit_rate": None,
        "bytes_up": sum(s.bytes_up for s in samples), "bytes_down": sum(s.bytes_down for s in samples),
    })
    return document
