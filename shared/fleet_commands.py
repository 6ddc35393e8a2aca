"""Commands to edges, signed: only a holder of the fleet's command key can steer an edge.

MQTT 3.1.1 carries no publisher identity, and anyone who can publish on the broker could set every
edge's draft length and mode. So a command (``{"id", "set", "ts"}``) carries ``sig``, the HMAC-SHA256
of its canonical JSON under a key the operator and the edges share (``--fleet-key-file``); an edge
applies a command only when the signature holds and ``ts`` is within ``MAX_AGE_S`` of its clock (a
captured command cannot be replayed later; within that window its id, applied once, stops it). An edge
without a key takes no commands. Pure: stdlib only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time

__all__ = ["MAX_AGE_S", "MIN_KEY_BYTES", "CommandRefused", "read_key_file", "sign", "verify"]

MAX_AGE_S = 300.0  # a command older (or further ahead) than this is refused
MIN_KEY_BYTES = 16


class CommandRefused(ValueError):
    """A command whose signature or age does not hold."""


def read_key_file(path) -> bytes:
    """The command key in the file at ``path`` (its bytes, surrounding whitespace stripped); ``ValueError``
    naming the file when it is missing or shorter than ``MIN_KEY_BYTES``."""
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"fleet key file not found: {path}")
    key = path.read_bytes().strip()
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"fleet key file {path} holds {len(key)} bytes; a key needs {MIN_KEY_BYTES} at least "
                         "(e.g. openssl rand -hex 32)")
    return key


def _canonical(command: dict) -> bytes:
    return json.dumps({k: command[k] for k in ("id", "set", "ts")}, sort_keys=True, separators=(",", ":")).encode()


def sign(command_id: str, settings: dict, key: bytes, now: float | None = None) -> dict:
    """The command document, signed with ``key``."""
    command = {"id": command_id, "set": settings, "ts": round(time.time() if now is None else now, 3)}
    command["sig"] = hmac.new(key, _canonical(command), hashlib.sha256).hexdigest()
    return command


def verify(command: dict, key: bytes, now: float | None = None) -> None:
    """Raise ``CommandRefused`` unless ``command`` is signed with ``key`` and fresh."""
    try:
        expected = hmac.new(key, _canonical(command), hashlib.sha256).hexdigest()
        signature, sent_at = str(command["sig"]), float(command["ts"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CommandRefused(f"an unsigned or malformed command ({exc!r})") from exc
    if not hmac.compare_digest(signature, expected):
        raise CommandRefused("a command whose signature does not hold (not the fleet's command key)")
    age = (time.time() if now is None else now) - sent_at
    if abs(age) > MAX_AGE_S:
        raise CommandRefused(f"a command {age:.0f} s old (more than {MAX_AGE_S:.0f} s from this clock)")
