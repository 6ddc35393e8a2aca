"""An embedded MQTT broker (amqtt: pure Python, nothing to install) for laptops, demos and tests.

Production fleets run their own broker (mosquitto, EMQX); edges and
verifiers only need its URL. This one listens on TCP, allows anonymous
clients and keeps retained messages in memory.
"""

from __future__ import annotations

import asyncio
import logging
import signal

__all__ = ["run_broker", "broker_config"]

log = logging.getLogger(__name__)


def broker_config(host: str, port: int) -> dict:
    return {
        "listeners": {"default": {"type": "tcp", "bind": f"{host}:{port}"}},
        "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
    }


async def run_broker(host: str = "127.0.0.1", port: int = 1883, ready=lambda url: None) -> None:
    """Serve until SIGTERM/SIGINT; ``ready(url)`` once listening."""
    from amqtt.broker import Broker

    for name in ("amqtt", "transitions"):  # per-connection chatter at INFO; keep it for -v
        logging.getLogger(name).setLevel(max(logging.getLogger().level, logging.WARNING))
    broker = Broker(broker_config(host, port))
    try:
        await broker.start()
    except Exception as exc:  # amqtt wraps a taken port in its own error type
        raise OSError(f"cannot listen on {host}:{port}: {exc}") from exc
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    ready(f"mqtt://{host}:{port}")
    await stopping.wait()
    await broker.shutdown()
