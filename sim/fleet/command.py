"""``splitspec fleet send``: an operator's command to one edge (``edge/{id}/cmd``, QoS 1)."""

from __future__ import annotations

import asyncio
import json
import secrets

from shared.fleet import parse_mqtt_url, topic
from shared.fleet_commands import sign

__all__ = ["send_command", "parse_settings"]

SETTINGS = {"max_draft_len": int, "mode": str}


def parse_settings(pairs: list[str]) -> dict:
    """``["max_draft_len=4", "mode=rejection"]`` -> ``{"max_draft_len": 4, "mode": "rejection"}``."""
    settings = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or name not in SETTINGS:
            raise ValueError(f"--set takes NAME=VALUE with NAME one of {', '.join(SETTINGS)}; got {pair!r}")
        try:
            settings[name] = SETTINGS[name](value)
        except ValueError as exc:
            raise ValueError(f"--set {name}: {exc}") from exc
    if not settings:
        raise ValueError("nothing to set: give --set NAME=VALUE")
    return settings


def send_command(url: str, edge_id: str, settings: dict, key: bytes, command_id: str | None = None) -> str:
    """Publish ``{"id", "set"}``, signed with the fleet's command ``key`` (``shared.fleet_commands``), to the
    edge's command topic (QoS 1: the edge applies each id once); returns the id."""
    broker = parse_mqtt_url(url)
    command_id = command_id or secrets.token_hex(8)
    payload = json.dumps(sign(command_id, settings, key)).encode()

    async def publish() -> None:
        async with broker.client(f"fleet-send-{command_id}") as client:
            await client.publish(topic("edge", edge_id, "cmd"), payload, qos=1)

    asyncio.run(publish())
    return command_id
