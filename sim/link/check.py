"""Measure what a `LinkEmulator` actually delivers, over real loopback sockets.

Contract. `link_check(config)` starts a local sink/echo server, puts a
`LinkEmulator` with `config` in front of it, and measures

- throughput, up direction: the client pushes `bulk_bytes` through the link
  and the sink timestamps each read. The rate is
  (bytes received after the first read) * 8 / (time of last read - time of
  first read). Timing from first to last byte at the receiver removes the
  one-way delay (and the serialization of the first segment) from the
  measurement, so a 50 ms delay is not counted against a 50 kbit/s rate. The
  result is a payload rate, so compare it with `rate_bps_effective` =
  rate * segment / (segment + overhead), not with the raw configured rate;
- round trip: `pings` sequential ping-pongs of a small probe on an idle link,
  median. `rtt_ms_raw` is that median; `rtt_ms_measured` subtracts the
  known serialization of the probe in each direction ((n + overhead) * 8 /
  rate, 8.5 ms each way for 1 byte at 50 kbit/s), leaving the propagation RTT
  that `rtt_ms_configured` (= up delay + down delay) describes.

Nothing here touches the network beyond 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import statistics
from typing import Any

from sim.link.config import LinkConfig
from sim.link.emulator import LinkEmulator

__all__ = ["link_check", "format_link_check"]

_PING = b"P"  # first byte of a connection: echo mode
_BULK = b"B"  # first byte of a connection: sink mode
_PROBE_BYTES = 16  # ping payload, bytes
_BULK_SECONDS = 3.0  # automatic bulk size aims at this transfer time
_UNLIMITED_BULK_BYTES = 8 * 1024 * 1024


def _auto_bulk_bytes(config: LinkConfig) -> int:
    """About _BULK_SECONDS of transfer, a whole number of segments."""
    up = config.up
    if up.rate_bps <= 0:
        return _UNLIMITED_BULK_BYTES
    n = int(up.effective_rate_bps * _BULK_SECONDS / 8)
    n = min(max(n, 4 * up.segment_bytes), 64 * 1024 * 1024)
    return max(1, n // up.segment_bytes) * up.segment_bytes


class _Sink:
    """Loopback server: echo connections and timed bulk sinks."""

    def __init__(self) -> None:
        self.reads: list[tuple[float, int]] = []  # (loop time, bytes) per bulk read
        self.bulk_done = asyncio.Event()
        self.expected = 0  # bulk bytes to wait for
        self._tasks: set[asyncio.Task] = set()

    def on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        try:
            mode = await reader.readexactly(1)
            if mode == _PING:
                while data := await reader.read(64 * 1024):
                    writer.write(data)
                    await writer.drain()
            elif mode == _BULK:
                total = 0
                while data := await reader.read(64 * 1024):
                    self.reads.append((loop.time(), len(data)))
                    total += len(data)
                    if total >= self.expected:
                        self.bulk_done.set()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _measure_rtt(port: int, pings: int) -> list[float]:
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_PING)
        probe = bytes(range(_PROBE_BYTES))
        # One warm-up round trip so connection setup is not in the samples.
        samples = []
        for i in range(pings + 1):
            t0 = loop.time()
            writer.write(probe)
            await writer.drain()
            await reader.readexactly(len(probe))
            if i:
                samples.append(loop.time() - t0)
        return samples
    finally:
        writer.close()


async def _measure_bulk(port: int, sink: _Sink, bulk_bytes: int, timeout_s: float) -> None:
    sink.reads.clear()
    sink.bulk_done.clear()
    sink.expected = bulk_bytes
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_BULK + bytes(bulk_bytes))
        await writer.drain()
        await asyncio.wait_for(sink.bulk_done.wait(), timeout_s)
    finally:
        writer.close()


async def link_check(config: LinkConfig, bulk_bytes: int | None = None,
                     pings: int = 10, timeout_s: float = 60.0) -> dict[str, Any]:
    """Measure rate (up direction) and RTT of `config`; see the module docstring.

    `bulk_bytes=None` picks about 3 s worth of the up link's effective rate
    (8 MiB when unlimited). Returns rate_bps_configured (raw, up),
    rate_bps_effective (payload, up), rate_bps_measured, rtt_ms_configured,
    rtt_ms_measured (serialization of the probe removed), rtt_ms_raw,
    bulk_bytes, pings. Rates are None when the up link is unlimited.
    """
    if bulk_bytes is None:
        bulk_bytes = _auto_bulk_bytes(config)
    if bulk_bytes < 2 or pings < 1:
        raise ValueError("need bulk_bytes >= 2 and pings >= 1")
    sink = _Sink()
    server = await asyncio.start_server(sink.on_client, "127.0.0.1", 0)
    try:
        upstream_port = server.sockets[0].getsockname()[1]
        async with LinkEmulator(config, "127.0.0.1", 0, "127.0.0.1", upstream_port) as emu:
            rtts = await _measure_rtt(emu.port, pings)
            await _measure_bulk(emu.port, sink, bulk_bytes, timeout_s)
    finally:
        server.close()
        await sink.close()
        await server.wait_closed()

    (t_first, n_first), (t_last, _) = sink.reads[0], sink.reads[-1]
    after_first = sum(n for _, n in sink.reads) - n_first
    span = t_last - t_first
    measured = after_first * 8 / span if span > 0 and after_first > 0 else None

    up, down = config.up, config.down
    serialization_s = sum(
        (_PROBE_BYTES + d.overhead_bytes) * 8 / d.rate_bps for d in (up, down) if d.rate_bps > 0)
    rtt_raw = statistics.median(rtts)
    return {
        "rate_bps_configured": up.rate_bps or None,
        "rate_bps_effective": up.effective_rate_bps or None,
        "rate_bps_measured": measured,
        "rtt_ms_configured": config.rtt_s * 1000,
        "rtt_ms_measured": (rtt_raw - serialization_s) * 1000,
        "rtt_ms_raw": rtt_raw * 1000,
        "bulk_bytes": bulk_bytes,
        "pings": pings,
    }


def format_link_check(r: dict[str, Any]) -> str:
    """The ``link_check`` result as a terminal table: configured vs measured."""
    from tabulate import tabulate

    def rate(v: float | None) -> str:
        return "unlimited" if v is None else f"{v / 1e3:,.1f} kbit/s"

    def ratio(measured: float | None, expected: float | None) -> str:
        if not measured or not expected:
            return ""
        return f"{(measured / expected - 1) * 100:+.1f}%"

    rows = [
        ("rate up (raw)", rate(r["rate_bps_configured"]), "", ""),
        ("rate up (payload)", rate(r["rate_bps_effective"]), rate(r["rate_bps_measured"]),
         ratio(r["rate_bps_measured"], r["rate_bps_effective"])),
        ("RTT (propagation)", f"{r['rtt_ms_configured']:.1f} ms", f"{r['rtt_ms_measured']:.1f} ms",
         f"{r['rtt_ms_measured'] - r['rtt_ms_configured']:+.1f} ms"),
        ("RTT (raw, with serialization)", "", f"{r['rtt_ms_raw']:.1f} ms", ""),
    ]
    table = tabulate(rows, headers=("", "configured", "measured", "diff"), tablefmt="simple", disable_numparse=True)
    return f"{table}\n({r['bulk_bytes']} bulk bytes, {r['pings']} pings)"

