"""``splitspec fleet watch``: every edge and verifier replica seen on the broker, live.

The view is built from the topic tree of ``shared.fleet``: retained status
and load arrive on subscribing, telemetry as it is published. ``--once``
collects for a moment and returns the view as
``{"edges": {id: {...}}, "clouds": {replica: {...}}}``.
"""

from __future__ import annotations

import asyncio
import json
import time

from shared.fleet import PREFIX, parse_mqtt_url

__all__ = ["FleetView", "watch_once", "watch_live"]


class FleetView:
    def __init__(self) -> None:
        self.edges: dict[str, dict] = {}
        self.clouds: dict[str, dict] = {}

    def update(self, topic: str, payload: bytes) -> None:
        parts = topic.split("/")
        if len(parts) != 5 or "/".join(parts[:2]) != PREFIX or parts[2] not in ("edge", "cloud"):
            return
        try:
            document = json.loads(payload)
        except ValueError:
            return
        if not isinstance(document, dict) or parts[4] == "cmd":
            return
        table = self.edges if parts[2] == "edge" else self.clouds
        table.setdefault(parts[3], {})[parts[4]] = document

    def to_json(self) -> dict:
        return {"edges": self.edges, "clouds": self.clouds}


async def _collect(url: str, view: FleetView, until) -> None:
    async with parse_mqtt_url(url).client(f"fleet-watch-{time.time_ns()}") as client:
        await client.subscribe(f"{PREFIX}/#")
        async for message in client.messages:
            view.update(message.topic.value, message.payload)
            if until():
                return


def watch_once(url: str, settle_s: float = 1.0) -> dict:
    """The fleet as the broker knows it after ``settle_s`` seconds of listening."""
    view = FleetView()

    async def run() -> None:
        try:
            await asyncio.wait_for(_collect(url, view, lambda: False), settle_s)
        except TimeoutError:
            pass

    asyncio.run(run())
    return view.to_json()


def watch_live(url: str, refresh_s: float = 1.0) -> None:
    """A terminal table of the fleet, redrawn as messages arrive (until interrupted)."""
    from rich.live import Live
    from rich.table import Table

    view = FleetView()

    def render() -> Table:
        table = Table(title=f"splitspec fleet on {parse_mqtt_url(url)}")  # (its str names no password)
        for column in ("kind", "name", "state", "tok/s", "α by position", "D", "W", "RTT ms", "load"):
            table.add_column(column)
        for name, docs in sorted(view.clouds.items()):
            status, load = docs.get("status", {}), docs.get("load", {})
            table.add_row("cloud", name, status.get("state", "?"), "", "", str(load.get("suggested_max_draft_len", "")),
                          "", "", f"{load.get('sessions', '?')} sessions, {load.get('free_slots', '?')} free, "
                          f"p50 {load.get('verify_latency_p50_s')}s")
        for name, docs in sorted(view.edges.items()):
            status, tele = docs.get("status", {}), docs.get("telemetry", {})
            table.add_row("edge", name, status.get("state", "?"), str(tele.get("tokens_per_s", "")),
                          " ".join(f"{a:.2f}" for a in tele.get("alpha_at", [])[:8]), str(tele.get("D", "")),
                          str(tele.get("W", "")), str(tele.get("rtt_ms", "")), tele.get("served_by", ""))
        return table

    async def run() -> None:
        with Live(render(), refresh_per_second=max(1, int(1 / refresh_s))) as live:
            last = 0.0

            def refresh() -> bool:
                nonlocal last
                if time.monotonic() - last >= refresh_s:
                    live.update(render())
                    last = time.monotonic()
                return False

            await _collect(url, view, refresh)

    asyncio.run(run())
