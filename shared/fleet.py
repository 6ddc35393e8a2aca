"""Fleet telemetry and control over MQTT: the topic tree, and the client both sides run.

gRPC carries the data; MQTT carries state, telemetry and commands. Topics,
under ``splitspec/v1/``:

- ``edge/{id}/status``: retained, QoS 1, ``{"state": "online"|"offline", ...}``;
  the broker publishes ``offline`` as the last will when an edge dies, and
  the edge publishes it itself on a clean stop (a clean disconnect does not
  fire the will);
- ``edge/{id}/telemetry``: QoS 0, retained (the last figures), periodic, within a byte budget;
- ``edge/{id}/cmd``: QoS 1, ``{"id": ..., "set": {...}}``, applied once per id;
- ``cloud/{replica}/status``: retained + will, as for edges;
- ``cloud/{replica}/load``: retained: sessions, free slots, verify latency,
  the draft length the replica suggests (edges respect it).

``FleetClient`` runs aiomqtt (the maintained successor of asyncio-mqtt) on
its own event loop thread, so publishing never blocks decoding; it
reconnects with exponential backoff (tenacity) when the broker goes away and
republishes its retained state when it is back. Telemetry that does not fit
the byte budget, or comes while disconnected, is dropped (it is periodic).

A broker is a URL (``parse_mqtt_url``): ``mqtt://`` in the clear, ``mqtts://`` over TLS (port 8883 by
default; the system's CAs, or ``?ca=PATH``), with ``user[:password]@`` for a broker that checks
passwords (a user without one in the URL takes ``$SPLITSPEC_MQTT_PASSWORD``, so it need not show in a
process list).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlparse

__all__ = ["Broker", "FleetClient", "FleetCounts", "parse_mqtt_url", "PASSWORD_ENV", "topic", "ByteBudget", "DEFAULT_TELEMETRY_PERIOD_S",
           "DEFAULT_BUDGET_BPS", "PREFIX"]

log = logging.getLogger(__name__)

PREFIX = "splitspec/v1"
DEFAULT_TELEMETRY_PERIOD_S = 10.0
DEFAULT_BUDGET_BPS = 1_000  # bits/s of MQTT payload and framing at most: 2% of a 50 kbit/s uplink
_MQTT_OVERHEAD_BYTES = 60  # per message, beyond topic and payload: MQTT fixed header and TCP/IP share (an estimate)


def topic(kind: str, ident: str, leaf: str) -> str:
    """``splitspec/v1/{kind}/{ident}/{leaf}``; ``kind`` is ``edge`` or ``cloud``."""
    if kind not in ("edge", "cloud") or not ident or any(c in ident for c in "/+#"):
        raise ValueError(f"bad fleet topic parts: {kind!r}, {ident!r}")
    return f"{PREFIX}/{kind}/{ident}/{leaf}"


PASSWORD_ENV = "SPLITSPEC_MQTT_PASSWORD"  # the broker password of a URL that names a user and no password


@dataclass(frozen=True)
class Broker:
    """Where the broker is and how to reach it (``parse_mqtt_url``)."""

    host: str
    port: int
    tls: bool = False  # mqtts://: the connection is TLS, the broker's certificate checked
    ca_file: str | None = None  # the CA that signed the broker's certificate (None: the system's)
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def client(self, identifier: str, **kwargs):
        """An ``aiomqtt.Client`` for this broker (``kwargs``: the rest of aiomqtt's, a will, say)."""
        import aiomqtt

        context = ssl.create_default_context(cafile=self.ca_file) if self.tls else None
        return aiomqtt.Client(self.host, self.port, identifier=identifier, username=self.username,
                              password=self.password, tls_context=context, **kwargs)

    def __str__(self) -> str:
        user = f"{self.username}@" if self.username else ""
        return f"{'mqtts' if self.tls else 'mqtt'}://{user}{self.host}:{self.port}"


def _redacted(url: str) -> str:
    """``url`` with any password in it replaced (error messages must not carry it)."""
    scheme, sep, rest = url.rpartition("://")
    userinfo, at, hostpart = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}{sep}{userinfo.split(':', 1)[0]}:***@{hostpart}"


def parse_mqtt_url(url: str) -> Broker:
    """The broker ``mqtt[s]://[USER[:PASSWORD]@]HOST[:PORT][?ca=PATH]`` names (``HOST[:PORT]`` alone: plain
    MQTT); ``ValueError`` for anything else. ``mqtts`` is TLS (port 8883 by default, else 1883); ``ca``,
    only with ``mqtts``, is the PEM CA to trust; a user without a password takes ``$SPLITSPEC_MQTT_PASSWORD``."""
    parsed = urlparse(url if "://" in url else f"mqtt://{url}")
    shown = _redacted(url)
    if parsed.scheme not in ("mqtt", "tcp", "mqtts", "ssl") or not parsed.hostname:
        raise ValueError(f"not an MQTT broker URL: {shown!r} (expected mqtt://HOST[:PORT] or mqtts://HOST[:PORT])")
    tls = parsed.scheme in ("mqtts", "ssl")
    try:
        port = parsed.port or (8883 if tls else 1883)
    except ValueError as exc:
        raise ValueError(f"bad port in MQTT URL {shown!r}") from exc
    query = parse_qs(parsed.query, keep_blank_values=True)
    unknown = sorted(set(query) - {"ca"})
    if unknown or any(len(values) != 1 for values in query.values()):
        raise ValueError(f"MQTT URL {shown!r}: the only query parameter is ca=PATH, once (got {', '.join(unknown)})")
    ca_file = query["ca"][0] if "ca" in query else None
    if ca_file is not None and not tls:
        raise ValueError(f"MQTT URL {shown!r}: ca= is for mqtts:// (TLS)")
    username = unquote(parsed.username) if parsed.username else None
    password = unquote(parsed.password) if parsed.password is not None else None
    if username and password is None:
        password = os.environ.get(PASSWORD_ENV)
    return Broker(parsed.hostname, port, tls, ca_file, username, password)


class ByteBudget:
    """A token bucket of ``bits_per_s`` (burst: ``burst_s`` seconds of it); clock injectable."""

    def __init__(self, bits_per_s: float, burst_s: float = 20.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = bits_per_s / 8
        self.capacity = self.rate * burst_s
        self.level = self.capacity
        self._clock = clock
        self._last = clock()

    def take(self, nbytes: int) -> bool:
        now = self._clock()
        self.level = min(self.capacity, self.level + (now - self._last) * self.rate)
        self._last = now
        if nbytes > self.level:
            return False
        self.level -= nbytes
        return True


@dataclass
class FleetCounts:
    """What a ``FleetClient`` has done so far (read from any thread; written on the client's loop)."""

    connections: int = 0  # successful connections (1 + reconnects)
    sent_bytes: int = 0  # topic + payload + framing estimate, of messages handed to the broker
    dropped: int = 0  # telemetry dropped (budget, or no broker)
    commands_applied: int = 0


@dataclass
class _Outgoing:
    topic: str
    payload: bytes
    qos: int
    retain: bool


class FleetClient:
    """One MQTT connection for a component (``kind``/``ident``), on its own thread.

    ``status`` is the retained status document (republished on every
    reconnect); ``publish`` queues a message (QoS 0 telemetry may be dropped by
    the byte budget); ``on_command`` receives each new command document once.
    """

    def __init__(self, url: str, kind: str, ident: str, *, budget_bps: float = DEFAULT_BUDGET_BPS,
                 on_command: Callable[[dict], None] | None = None, keepalive_s: int = 30) -> None:
        self.broker = parse_mqtt_url(url)
        self.kind, self.ident = kind, ident
        self.budget = ByteBudget(budget_bps)
        self.on_command = on_command
        self.keepalive_s = keepalive_s
        self.status: dict = {"state": "online"}
        self.connected = threading.Event()
        self.counts = FleetCounts()
        self._seen_commands: deque[str] = deque(maxlen=256)
        self._watches: list[tuple[str, Callable[[str, dict], None]]] = []
        self._loop = asyncio.new_event_loop()
        self._queue: asyncio.Queue[_Outgoing] = asyncio.Queue()  # bound to our loop on first use
        self._offline: _Outgoing | None = None  # the stop's offline status, once queued
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"mqtt-{ident}", daemon=True)
        self._task = None
        self._run_task: asyncio.Task | None = None
        self._finished = threading.Event()

    @property
    def status_topic(self) -> str:
        """Where the retained status document (and the will) is published."""
        return topic(self.kind, self.ident, "status")

    # -- the caller's side (any thread) ---------------------------------------
    def start(self) -> FleetClient:
        self._thread.start()
        self._task = asyncio.run_coroutine_threadsafe(self._run(), self._loop)
        return self

    def watch(self, topic_filter: str, callback: Callable[[str, dict], None]) -> None:
        """Call ``callback(topic, document)`` for every JSON message on ``topic_filter`` (MQTT
        wildcards allowed; retained ones arrive on connecting). Register before ``start``."""
        self._watches.append((topic_filter, callback))

    def set_status(self, **fields) -> None:
        """Update the retained status document and publish it (QoS 1, retained)."""
        self.status.update(fields)
        self._put(_Outgoing(self.status_topic, self._status_bytes(), 1, True))

    def publish(self, leaf: str, document: dict, *, qos: int = 0, retain: bool = False) -> bool:
        """Queue ``document`` on ``{kind}/{ident}/{leaf}``; False when the budget or the link dropped it."""
        payload = json.dumps(document, separators=(",", ":")).encode()
        message = _Outgoing(topic(self.kind, self.ident, leaf), payload, qos, retain)
        if qos == 0 and (not self.connected.is_set() or not self.budget.take(self._size(message))):
            self.counts.dropped += 1
            return False
        self._put(message)
        return True

    def publish_to(self, full_topic: str, document: dict, *, qos: int = 1, retain: bool = False) -> None:
        """Queue ``document`` on any topic (an operator's command to an edge, say)."""
        self._put(_Outgoing(full_topic, json.dumps(document, separators=(",", ":")).encode(), qos, retain))

    def stop(self, timeout_s: float = 5.0) -> None:
        """Publish ``offline`` (a clean stop does not fire the will), then disconnect."""
        if self._task is None:
            return
        self.status["state"] = "offline"
        done = threading.Event()
        self._loop.call_soon_threadsafe(self._begin_stop, done)
        done.wait(timeout_s)
        self._task.cancel()  # the run's task: leaving the client's context sends a clean DISCONNECT
        if self._run_task is not None:
            self._finished.wait(timeout_s)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
        self._task = None

    # -- the loop's side ---------------------------------------------------------
    def _put(self, message: _Outgoing) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, message)

    @staticmethod
    def _size(message: _Outgoing) -> int:
        return len(message.topic) + len(message.payload) + _MQTT_OVERHEAD_BYTES

    def _status_bytes(self) -> bytes:
        return json.dumps({**self.status, "ts": round(time.time(), 3)}, separators=(",", ":")).encode()

    def _begin_stop(self, done: threading.Event) -> None:
        self._stop_done = done
        if self.connected.is_set():
            self._offline = _Outgoing(self.status_topic, self._status_bytes(), 1, True)
            self._queue.put_nowait(self._offline)
        else:
            done.set()

    async def _run(self) -> None:
        self._run_task = asyncio.current_task()
        try:
            await self._connect_forever()
        finally:
            self._finished.set()

    async def _connect_forever(self) -> None:
        import aiomqtt
        from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential_jitter

        will = aiomqtt.Will(self.status_topic, json.dumps({"state": "offline"}).encode(), qos=1, retain=True)
        retrying = AsyncRetrying(wait=wait_exponential_jitter(multiplier=0.2, max=10.0, jitter=0.2),
                                 retry=retry_if_exception_type(aiomqtt.MqttError), reraise=True)
        async for attempt in retrying:
            with attempt:
                async with self.broker.client(f"{self.kind}-{self.ident}", will=will, keepalive=self.keepalive_s,
                                              clean_session=True) as client:
                    await self._serve(client)
                    return

    async def _serve(self, client) -> None:
        import aiomqtt

        self.counts.connections += 1
        try:
            await client.publish(self.status_topic, self._status_bytes(), qos=1, retain=True)
            if self.on_command is not None:
                await client.subscribe(topic(self.kind, self.ident, "cmd"), qos=1)
            for topic_filter, _ in self._watches:
                await client.subscribe(topic_filter, qos=0)
            self.connected.set()  # (once subscribed: a command sent from now on reaches it)
            log.info("fleet: %s %s connected to %s", self.kind, self.ident, self.broker)
            # The listener's iteration is what notices a lost connection: wait on it and on the
            # queue together, so an idle client reconnects as soon as the broker goes away.
            listener = asyncio.create_task(self._listen(client))
            try:
                while True:
                    getter = asyncio.ensure_future(self._queue.get())
                    await asyncio.wait({getter, listener}, return_when=asyncio.FIRST_COMPLETED)
                    if listener.done():
                        getter.cancel()
                        if getter.done() and not getter.cancelled():
                            self._queue.put_nowait(getter.result())  # taken, not sent: keep it
                        listener.result()  # raises the connection's error
                        raise aiomqtt.MqttError("the broker connection ended")
                    message = getter.result()
                    try:
                        await client.publish(message.topic, message.payload, qos=message.qos, retain=message.retain)
                    except aiomqtt.MqttError:
                        self._queue.put_nowait(message)  # sent after the reconnection
                        raise
                    self.counts.sent_bytes += self._size(message)
                    if message is self._offline:
                        self._stop_done.set()
                        return
            finally:
                listener.cancel()
        finally:
            self.connected.clear()

    async def _listen(self, client) -> None:
        command_topic = topic(self.kind, self.ident, "cmd")
        async for message in client.messages:
            if message.topic.value != command_topic:
                for topic_filter, callback in self._watches:
                    if message.topic.matches(topic_filter):
                        try:
                            callback(message.topic.value, json.loads(message.payload))
                        except Exception as exc:  # noqa: BLE001 - a bad message must not stop the client
                            log.debug("fleet: ignored a message on %s: %s", message.topic.value, exc)
                continue
            try:
                command = json.loads(message.payload)
                ident = str(command["id"])
            except (ValueError, KeyError, TypeError):
                log.warning("fleet: ignored a malformed command on %s", message.topic)
                continue
            if ident in self._seen_commands:  # redelivered (QoS 1 is at least once): applied already
                continue
            self._seen_commands.append(ident)
            try:
                self.on_command(command)
                self.counts.commands_applied += 1
                self.set_status(last_command=ident)
            except Exception as exc:  # noqa: BLE001 - a bad command must not stop the client
                log.warning("fleet: command %s refused: %s", ident, exc)
