"""User-space network link emulator: an asyncio TCP proxy that shapes bytes.

Contract. A `LinkEmulator` listens on a local port; every accepted connection
opens its own upstream connection and the bytes are relayed both ways,
unmodified and in order (gRPC / HTTP2 passes through as opaque bytes). Each
direction (`up` = client -> upstream, `down` = upstream -> client) is an
emulated link with

- bandwidth: segments of at most `segment_bytes` payload occupy the link for
  `(n + overhead_bytes) * 8 / rate_bps` seconds each, FIFO (a token bucket one
  segment deep). The link is shared by all connections in that direction,
  as a real access link is;
- propagation: one-way `delay_s` plus jitter, after serialization. Jitter
  never reorders bytes: a segment is delivered at
  `max(previous delivery on that connection, sent + delay + jitter)`;
- loss: TCP never loses bytes, so a lost segment is modelled as a
  retransmission stall of `rto_s` added before its delivery (and, through the
  ordering rule, before everything behind it on that connection);
- faults: `cut_after_s` aborts every connection open at that time since
  `start()` (a one-shot link flap; later connections are served normally);
  `cut_after_bytes` aborts a connection once that many payload bytes, both
  directions together, have been delivered through it; `arm_cuts(offsets)`
  aborts whichever connection carries each given byte of the whole link
  (one-shot cuts at exact offsets, for fault injection); `cut_all()` aborts
  every connection now.

Delay is implemented with timestamped per-connection queues drained by one
writer task per direction, so propagation overlaps with serialization and the
throughput is the configured rate regardless of the delay. The reader stops
reading from a sender while more than `queue_bytes` plus the bandwidth-delay
product are held in the emulator, so a stalled receiver pushes back.

Randomness (jitter, loss) comes from one `random.Random(seed)`; a single
connection driven the same way sees the same outcomes every run.

The configuration and the timing math live in `sim.link.config` (the pure
`schedule_segment()`); the classes here only do I/O.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque

from sim.link.config import BurstStalls, DirectionConfig, LinkConfig, schedule_segment

log = logging.getLogger(__name__)

__all__ = ["LinkEmulator"]

class _Direction:
    """One direction of one connection: a timestamped FIFO and its two ends."""

    def __init__(self, name: str, cfg: DirectionConfig, conn: _Connection,
                 src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        self.name = name  # "up" or "down"
        self.cfg = cfg
        self.conn = conn
        self.src = src
        self.dst = dst
        self.items: deque[tuple[float, bytes | None]] = deque()  # (deliver_at, data); None = EOF
        self.has_items = asyncio.Event()
        self.space = asyncio.Event()
        self.space.set()
        self.unwritten = 0  # payload bytes read but not yet written, bytes
        self.window = cfg.window_bytes()
        self.last_delivery = 0.0  # loop time of the latest scheduled delivery

    async def read_loop(self) -> None:
        emu = self.conn.emu
        loop = asyncio.get_running_loop()
        seg = self.cfg.segment_bytes
        while True:
            data = await self.src.read(64 * 1024)
            now = loop.time()
            if not data:
                # FIN: no serialization, no loss, behind all data.
                self.last_delivery = max(self.last_delivery, now + self.cfg.delay_s)
                self._push(self.last_delivery, None)
                return
            for off in range(0, len(data), seg):
                chunk = data[off:off + seg]
                free_at, self.last_delivery, lost = schedule_segment(
                    self.cfg, len(chunk), now, emu._free_at[self.name], self.last_delivery,
                    emu._rng, emu.stalls[self.name])
                emu._free_at[self.name] = free_at
                if lost:
                    emu.segments_lost[self.name] += 1
                self._push(self.last_delivery, chunk)
            while self.unwritten > self.window:
                self.space.clear()
                await self.space.wait()

    def _push(self, deliver_at: float, data: bytes | None) -> None:
        self.items.append((deliver_at, data))
        if data is not None:
            self.unwritten += len(data)
        self.has_items.set()

    async def write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self.items:
                self.has_items.clear()
                await self.has_items.wait()
            wait = self.items[0][0] - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            if self.items[0][1] is None:
                self.items.popleft()
                if self.dst.can_write_eof():
                    self.dst.write_eof()
                return
            # Coalesce every segment already due into one write.
            now = loop.time()
            parts = []
            while self.items and self.items[0][0] <= now and self.items[0][1] is not None:
                parts.append(self.items.popleft()[1])
            data = b"".join(parts)
            self.unwritten -= len(data)
            if not await self._deliver(data):
                return
            if self.unwritten <= self.window:
                self.space.set()

    async def _deliver(self, data: bytes) -> bool:
        """Write `data`, honouring cut_after_bytes and armed cuts; False once the connection is cut."""
        conn, emu = self.conn, self.conn.emu
        budget = emu.config.cut_after_bytes
        room, reason = len(data), ""
        if budget is not None and budget - conn.bytes_up - conn.bytes_down <= room:
            room, reason = max(0, budget - conn.bytes_up - conn.bytes_down), f"after {budget} bytes"
        if emu.armed_cuts and emu.armed_cuts[0] - emu.bytes_up - emu.bytes_down <= room:
            offset = emu.armed_cuts.popleft()
            room, reason = max(0, offset - emu.bytes_up - emu.bytes_down), f"at link byte {offset}"
            emu.armed_cuts_fired[self.name] += 1
        data = data[:room]
        self.dst.write(data)
        conn.count(self.name, len(data))
        if reason:
            await _flush(self.dst)
            conn.cut(reason)
            return False
        await self.dst.drain()
        return True


async def _flush(writer: asyncio.StreamWriter, limit_s: float = 1.0) -> None:
    """Wait until the transport's user-space buffer is empty (bounded)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while writer.transport.get_write_buffer_size() and loop.time() < deadline:
        await asyncio.sleep(0.001)


class _Connection:
    """One client connection and its upstream connection."""

    def __init__(self, emu: LinkEmulator, cid: int,
                 reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.emu = emu
        self.cid = cid
        self.client = (reader, writer)
        self.upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.bytes_up = 0  # payload bytes delivered upstream
        self.bytes_down = 0  # payload bytes delivered to the client
        self.cut_reason: str | None = None
        self.task: asyncio.Task | None = None

    def count(self, direction: str, n: int) -> None:
        if direction == "up":
            self.bytes_up += n
            self.emu.bytes_up += n
        else:
            self.bytes_down += n
            self.emu.bytes_down += n

    def cut(self, reason: str) -> None:
        """Abort both sides (the run task's cleanup does the closing)."""
        if self.cut_reason is None and self.task is not None and not self.task.done():
            self.cut_reason = reason
            self.emu.cuts += 1
            self.task.cancel()

    async def run(self) -> None:
        emu = self.emu
        peer = self.client[1].get_extra_info("peername")
        abort = False
        try:
            try:
                self.upstream = await asyncio.open_connection(emu.upstream_host, emu.upstream_port)
            except OSError as e:
                log.warning("conn %d from %s: upstream %s:%d unreachable: %s",
                            self.cid, peer, emu.upstream_host, emu.upstream_port, e)
                abort = True
                return
            log.info("conn %d open from %s", self.cid, peer)
            up = _Direction("up", emu.config.up, self, self.client[0], self.upstream[1])
            down = _Direction("down", emu.config.down, self, self.upstream[0], self.client[1])
            try:
                async with asyncio.TaskGroup() as tg:
                    for d in (up, down):
                        tg.create_task(d.read_loop())
                        tg.create_task(d.write_loop())
            except* (ConnectionError, OSError) as eg:
                abort = True
                log.info("conn %d reset: %s", self.cid, eg.exceptions[0])
        except asyncio.CancelledError:
            abort = True
            current = asyncio.current_task()
            if self.cut_reason is None or (current is not None and current.uncancel() > 0):
                raise  # stop() or an outer cancel, not our own cut
            log.info("conn %d cut %s", self.cid, self.cut_reason)
        finally:
            for _, w in filter(None, (self.client, self.upstream)):
                if abort:
                    w.transport.abort()
                else:
                    w.close()
            log.info("conn %d closed: up=%d B down=%d B", self.cid, self.bytes_up, self.bytes_down)


class LinkEmulator:
    """Asyncio TCP proxy applying a `LinkConfig`; see the module docstring.

    Counters (all connections, since construction): `bytes_up`, `bytes_down`
    (payload bytes delivered each way), `connections` (accepted),
    `segments_lost` ({"up": n, "down": n} retransmission stalls).
    """

    def __init__(self, config: LinkConfig, listen_host: str = "127.0.0.1",
                 listen_port: int = 0, upstream_host: str = "127.0.0.1",
                 upstream_port: int = 0) -> None:
        self.config = config
        self.listen_host = listen_host
        self.listen_port = listen_port
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.port: int | None = None  # bound port, set by start()
        self.bytes_up = 0
        self.bytes_down = 0
        self.connections = 0
        self.segments_lost = {"up": 0, "down": 0}
        self._rng = random.Random(config.seed)
        self._free_at = {"up": 0.0, "down": 0.0}  # loop time each shared link is next idle
        # Each direction's burst stalls, shared by its connections (a fade stalls the whole link).
        self.stalls = {"up": BurstStalls(config.up, config.seed + 1), "down": BurstStalls(config.down, config.seed + 2)}
        self._server: asyncio.Server | None = None
        self._conns: set[_Connection] = set()
        self._cut_timer: asyncio.TimerHandle | None = None
        self.armed_cuts: deque[int] = deque()  # one-shot cuts, at these link byte offsets (ascending)
        self.armed_cuts_fired = {"up": 0, "down": 0}  # armed cuts that fired, by the direction they cut
        self.cuts = 0  # connections cut by a fault (any kind)

    @property
    def active_connections(self) -> int:
        return len(self._conns)

    def arm_cuts(self, offsets) -> None:
        """Cut whichever connection carries the link's byte ``offset`` (payload bytes delivered
        through the emulator since construction, both directions), once per offset. The cut
        lands exactly there: mid-message as often as between messages."""
        self.armed_cuts = deque(sorted(int(o) for o in offsets))

    def cut_all(self, reason: str = "on request") -> int:
        """Abort every open connection now; returns how many."""
        conns = list(self._conns)
        for conn in conns:
            conn.cut(reason)
        return len(conns)

    async def start(self) -> None:
        """Bind and start accepting; `.port` holds the bound port afterwards."""
        loop = asyncio.get_running_loop()
        self._server = await asyncio.start_server(
            self._on_client, self.listen_host, self.listen_port)
        self.port = self._server.sockets[0].getsockname()[1]
        if self.config.cut_after_s is not None:
            self._cut_timer = loop.call_later(self.config.cut_after_s, self._cut_all)
        log.info("link %s:%d -> %s:%d up: %s; down: %s", self.listen_host, self.port,
                 self.upstream_host, self.upstream_port,
                 self.config.up.describe(), self.config.down.describe())

    def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A plain callback, not a coroutine: the connection runs in a task we own.
        self.connections += 1
        conn = _Connection(self, self.connections, reader, writer)
        conn.task = asyncio.get_running_loop().create_task(conn.run())
        self._conns.add(conn)
        conn.task.add_done_callback(lambda _t: self._conns.discard(conn))

    def _cut_all(self) -> None:
        log.info("cutting %d connection(s) at %.3f s", len(self._conns), self.config.cut_after_s)
        self.cut_all(f"at {self.config.cut_after_s} s")

    async def stop(self) -> None:
        """Stop listening and abort open connections; waits for their tasks."""
        if self._cut_timer is not None:
            self._cut_timer.cancel()
            self._cut_timer = None
        if self._server is not None:
            self._server.close()
        tasks = [c.task for c in self._conns if c.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> LinkEmulator:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
