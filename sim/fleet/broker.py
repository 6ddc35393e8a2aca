"""An embedded MQTT broker (amqtt: pure Python, nothing to install) for laptops, demos and tests.

Production fleets run their own broker (mosquitto, EMQX); edges and
verifiers only need its URL. This one listens on TCP, keeps retained messages
in memory, and allows anonymous clients unless given a users file (amqtt's
``user:hash`` lines, Argon2 hashes: ``hash_password``), then only those users
with their passwords; with a certificate and key it speaks MQTT over TLS only.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass
from pathlib import Path

__all__ = ["run_broker", "broker_config", "hash_password", "BrokerSecurity"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BrokerSecurity:
    """What the broker asks of a client: TLS (``tls_cert`` and ``tls_key``, PEM files) and a password
    (``users``: amqtt's password file). Neither: plain MQTT, anyone."""

    tls_cert: Path | None = None
    tls_key: Path | None = None
    users: Path | None = None

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        for path in (self.tls_cert, self.tls_key, self.users):
            if path is not None and not Path(path).is_file():
                raise FileNotFoundError(f"not found: {path}")


def broker_config(host: str, port: int, security: BrokerSecurity = BrokerSecurity()) -> dict:
    """amqtt's configuration for a broker on ``host:port`` asking what ``security`` says."""
    listener: dict = {"type": "tcp", "bind": f"{host}:{port}"}
    if security.tls_cert is not None:
        listener.update(ssl=True, certfile=str(security.tls_cert), keyfile=str(security.tls_key))
    if security.users is not None:
        plugins = {"amqtt.plugins.authentication.FileAuthPlugin": {"password_file": str(security.users)}}
    else:
        plugins = {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}}
    return {"listeners": {"default": listener}, "plugins": plugins}


def hash_password(user: str, password: str) -> str:
    """A users file's line for ``user`` (``user:<Argon2 hash>``); ValueError for a user the file cannot hold."""
    from pwdlib import PasswordHash

    if not user or ":" in user or any(c.isspace() for c in user):
        raise ValueError(f"a user name has no ':' and no space, got {user!r}")
    if not password:
        raise ValueError("an empty password")
    return f"{user}:{PasswordHash.recommended().hash(password)}"


async def run_broker(host: str = "127.0.0.1", port: int = 1883, ready=lambda url: None,
                     security: BrokerSecurity = BrokerSecurity()) -> None:
    """Serve until SIGTERM/SIGINT; ``ready(url)`` once listening."""
    from amqtt.broker import Broker

    for name in ("amqtt", "transitions"):  # per-connection chatter at INFO; keep it for -v
        logging.getLogger(name).setLevel(max(logging.getLogger().level, logging.WARNING))
    broker = Broker(broker_config(host, port, security))
    try:
        await broker.start()
    except Exception as exc:  # amqtt wraps a taken port in its own error type
        raise OSError(f"cannot listen on {host}:{port}: {exc}") from exc
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    ready(f"{'mqtts' if security.tls_cert else 'mqtt'}://{host}:{port}")
    await stopping.wait()
    await broker.shutdown()
