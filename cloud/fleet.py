"""The verifier's place in the fleet: its status and load on MQTT (``shared.fleet``).

``cloud/{replica}/load`` (retained) says what an operator and the edges need:
sessions (attached and parked), free slots, recent verify latency, the engine
queue, and the draft length this replica suggests. The suggestion shrinks as
the table fills: a busy verifier spends less on drafts it would reject, and
edges cap their draft length with it.
"""

from __future__ import annotations

import asyncio
import logging
import statistics

from cloud.servicer import VerifierServicer
from shared.fleet import DEFAULT_TELEMETRY_PERIOD_S, FleetClient
from shared.stats import percentile

__all__ = ["load_document", "suggested_draft_len", "report_load_forever"]

log = logging.getLogger(__name__)

MIN_SUGGESTED_DRAFT_LEN = 2


def suggested_draft_len(max_draft_len: int, sessions: int, max_sessions: int) -> int:
    """The draft length a replica suggests: its limit while at most half full, then shrinking
    linearly to ``MIN_SUGGESTED_DRAFT_LEN`` when full."""
    free = max(max_sessions - sessions, 0) / max(max_sessions, 1)
    return max(MIN_SUGGESTED_DRAFT_LEN, min(max_draft_len, round(max_draft_len * 2 * free)))


def load_document(servicer: VerifierServicer) -> dict:
    table, limits = servicer.table, servicer.limits
    latencies = sorted(servicer.recent_latencies_s)
    p99 = percentile(latencies, 0.99) if latencies else None
    return {
        "sessions": len(table),
        "parked": table.parked,
        "free_slots": max(limits.max_sessions - len(table), 0),
        "max_sessions": limits.max_sessions,
        "engine_queue": servicer.engine_queue,
        "verify_latency_p50_s": round(statistics.median(latencies), 4) if latencies else None,
        "verify_latency_p99_s": round(p99, 4) if p99 is not None else None,
        "suggested_max_draft_len": suggested_draft_len(limits.max_draft_len, len(table), limits.max_sessions),
        # Rows a forward costs alike (``Opened.row_tile``), for a session as opened and a reproducible one
        # (0: not said, an accelerator): where the fleet's edges may spend rows on longer blocks for free.
        "row_tile": servicer.engine.row_tile(),
        "row_tile_reproducible": servicer.engine.row_tile(reproducible=True),
    }


async def report_load_forever(servicer: VerifierServicer, client: FleetClient,
                              period_s: float = DEFAULT_TELEMETRY_PERIOD_S) -> None:
    """Publish the load (retained) every ``period_s`` seconds, and whenever it changed enough to matter."""
    last = None
    while True:
        document = load_document(servicer)
        if document != last:
            client.publish("load", document, qos=1, retain=True)
            last = document
        await asyncio.sleep(period_s)
