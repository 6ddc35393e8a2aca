"""The link emulator over real loopback sockets: rate, delay, integrity, faults."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import logging
import os
import random
import signal
import sys
from pathlib import Path

import pytest

from sim.commands.link import add_link_commands
from sim.link.check import link_check
from sim.link.config import BurstStalls, DirectionConfig, LinkConfig, parse_duration, parse_rate, schedule_segment
from sim.link.emulator import LinkEmulator
from sim.link.scenario import list_scenarios, load_scenario

REPO = Path(__file__).resolve().parents[2]
SHIPPED = {"acespec-50k", "lte", "lte-mobile", "wan", "satellite"}


def run(coro, timeout_s: float = 30.0):
    """Run a test coroutine on a fresh loop with a hard timeout."""
    async def guarded():
        return await asyncio.wait_for(coro, timeout_s)
    return asyncio.run(guarded())


class EchoServer:
    """Loopback echo server that honours half-close (echo until EOF, then close)."""

    def __init__(self, reply_after_eof: bytes | None = None) -> None:
        self.reply_after_eof = reply_after_eof  # if set: swallow input, send this at EOF
        self.received = 0  # bytes read, all connections
        self._tasks: set[asyncio.Task] = set()

    async def __aenter__(self) -> EchoServer:
        self.server = await asyncio.start_server(self._on_client, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    def _on_client(self, reader, writer) -> None:
        t = asyncio.get_running_loop().create_task(self._serve(reader, writer))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _serve(self, reader, writer) -> None:
        try:
            while data := await reader.read(65536):
                self.received += len(data)
                if self.reply_after_eof is None:
                    writer.write(data)
                    await writer.drain()
            if self.reply_after_eof is not None:
                writer.write(self.reply_after_eof)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.server.wait_closed()


async def read_until_closed(reader: asyncio.StreamReader) -> tuple[bytes, str]:
    """All bytes until EOF or reset, and which of the two ended the stream."""
    chunks = []
    try:
        while data := await reader.read(65536):
            chunks.append(data)
    except ConnectionError:
        return b"".join(chunks), "reset"
    return b"".join(chunks), "eof"


async def echo_roundtrip(port: int, payload: bytes) -> bytes:
    """Send payload, half-close, and return everything echoed back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def send():
        writer.write(payload)
        await writer.drain()
        writer.write_eof()

    sender = asyncio.create_task(send())
    got, how = await read_until_closed(reader)
    await sender
    writer.close()
    assert how == "eof"
    return got


async def wait_idle(emu: LinkEmulator, timeout_s: float = 5.0) -> None:
    """Wait until the emulator has no open connections (counters final)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while emu.active_connections and loop.time() < deadline:
        await asyncio.sleep(0.01)
    assert emu.active_connections == 0


# ---------------------------------------------------------------- parsing


@pytest.mark.parametrize("text, bps", [
    ("50kbit", 50_000), ("50 kbit", 50_000), ("10Mbit", 10_000_000), ("1.5mbit", 1_500_000),
    ("2gbit", 2_000_000_000), ("64000", 64_000), ("300bit", 300), ("50kbps", 50_000),
    ("5MBPS", 5_000_000), ("0", 0), (1e6, 1_000_000),
])
def test_parse_rate(text, bps):
    assert parse_rate(text) == bps


@pytest.mark.parametrize("bad", ["", "fast", "50kb", "50 kbit/s", "-5kbit", "kbit", "1e999mbit",
                                 "5 0kbit", None, True])
def test_parse_rate_rejects(bad):
    with pytest.raises(ValueError):
        parse_rate(bad)


@pytest.mark.parametrize("text, seconds", [
    ("50ms", 0.05), ("250us", 250e-6), ("1.5s", 1.5), ("0ms", 0.0), ("7 ms", 0.007), (0.2, 0.2),
])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "50", "50min", "ms", "-1ms", "fast", "1h", None, False])
def test_parse_duration_rejects(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


# ---------------------------------------------------------------- pure timing


def test_schedule_segment_serializes_fifo_then_propagates():
    cfg = DirectionConfig(rate_bps=8000, delay_s=0.5, segment_bytes=100, overhead_bytes=0)
    rng = random.Random(0)
    free_at, prev = 0.0, 0.0
    deliveries = []
    for _ in range(3):  # three 100-byte segments at t=0: 0.1 s each on the wire
        free_at, prev, lost = schedule_segment(cfg, 100, 0.0, free_at, prev, rng)
        deliveries.append(prev)
        assert not lost
    assert deliveries == pytest.approx([0.6, 0.7, 0.8])
    # An idle link starts serializing at `now`.
    free_at, prev, _ = schedule_segment(cfg, 100, 10.0, free_at, prev, rng)
    assert (free_at, prev) == pytest.approx((10.1, 10.6))


def test_schedule_segment_jitter_never_reorders_and_loss_stalls():
    cfg = DirectionConfig(delay_s=0.01, jitter_s=0.05, jitter_dist="normal", loss=0.5, rto_s=1.0)
    rng = random.Random(3)
    prev, stalls = 0.0, 0
    for i in range(200):
        now = i * 0.001
        _, deliver, lost = schedule_segment(cfg, 10, now, 0.0, prev, rng)
        assert deliver >= prev and deliver >= now
        if lost:
            assert deliver >= now + 1.0
            stalls += 1
        prev = deliver
    assert 60 < stalls < 140


def test_config_validation():
    with pytest.raises(ValueError):
        DirectionConfig(loss=1.0)
    with pytest.raises(ValueError):
        DirectionConfig(rate_bps=-1)
    with pytest.raises(ValueError):
        DirectionConfig(jitter_dist="pareto")
    assert DirectionConfig(rate_bps=1500).effective_rate_bps == pytest.approx(1448)


# ---------------------------------------------------------------- scenarios


def test_shipped_scenarios_all_load():
    assert set(list_scenarios()) == SHIPPED
    for name in SHIPPED:
        s = load_scenario(name)
        assert s.name == name and s.description
        assert s.link.up.rate_bps > 0 and s.link.down.rate_bps > 0
    ace = load_scenario("acespec-50k").link
    assert (ace.up.rate_bps, ace.down.rate_bps) == (50_000, 50_000)
    assert ace.rtt_s == pytest.approx(0.1)
    assert load_scenario("wan").link.rtt_s == pytest.approx(0.014)
    assert load_scenario("satellite").link.rtt_s == pytest.approx(0.6)
    lte = load_scenario("lte").link
    assert lte.down.rate_bps == 10_000_000 and lte.up.loss == pytest.approx(0.005)


def test_unknown_scenario_lists_shipped_names():
    with pytest.raises(ValueError, match="unknown scenario 'dialup'") as e:
        load_scenario("dialup")
    for name in SHIPPED:
        assert name in str(e.value)
    with pytest.raises(ValueError, match="not found"):
        load_scenario("/nonexistent/x.toml")


def test_user_scenario_file(tmp_path):
    good = tmp_path / "mine.toml"
    good.write_text('description = "x"\nseed = 4\n[up]\nrate = "1mbit"\ndelay = "10ms"\n'
                    '[faults]\ncut_after = "2s"\ncut_after_bytes = 99\n')
    s = load_scenario(str(good))
    assert s.name == "mine" and s.link.up.rate_bps == 1_000_000 and s.link.down.rate_bps == 0
    assert (s.link.cut_after_s, s.link.cut_after_bytes, s.link.seed) == (2.0, 99, 4)
    typo = tmp_path / "typo.toml"
    typo.write_text('[up]\nrat = "1mbit"\n')
    with pytest.raises(ValueError, match="unknown key.*rat"):
        load_scenario(typo)
    bad = tmp_path / "bad.toml"
    bad.write_text('[up]\nrate = "lots"\n')
    with pytest.raises(ValueError, match="bad rate"):
        load_scenario(bad)


# ---------------------------------------------------------------- end to end


def test_link_check_acespec_50k():
    r = run(link_check(load_scenario("acespec-50k").link))
    assert r["rate_bps_configured"] == 50_000
    assert r["rate_bps_effective"] == pytest.approx(50_000 * 1448 / 1500)
    assert r["rate_bps_measured"] == pytest.approx(r["rate_bps_effective"], rel=0.10)
    assert r["rtt_ms_configured"] == pytest.approx(100.0)
    assert 98.0 < r["rtt_ms_measured"] < 125.0  # (the delay is never cut short; a loaded machine adds to it)
    # Serialization of the probe is really there in the raw RTT (about 2 x 10.9 ms).
    assert r["rtt_ms_raw"] > r["rtt_ms_measured"] + 15


def test_byte_counters_exact():
    async def main():
        reply = bytes(777)
        async with EchoServer(reply_after_eof=reply) as srv, \
                LinkEmulator(LinkConfig(), upstream_port=srv.port) as emu:
            got = await echo_roundtrip(emu.port, os.urandom(12_345))
            assert got == reply
            await wait_idle(emu)
            assert (emu.bytes_up, emu.bytes_down, emu.connections) == (12_345, 777, 1)
            assert srv.received == 12_345
    run(main())


def test_integrity_both_ways_concurrent_connections():
    d = DirectionConfig(rate_bps=parse_rate("40mbit"), delay_s=0.002, jitter_s=0.002,
                        loss=0.02, rto_s=0.01)
    cfg = LinkConfig(up=d, down=d, seed=1)
    n, size = 4, 300_000

    async def main():
        payloads = [random.Random(i).randbytes(size) for i in range(n)]
        async with EchoServer() as srv, LinkEmulator(cfg, upstream_port=srv.port) as emu:
            got = await asyncio.gather(*(echo_roundtrip(emu.port, p) for p in payloads))
            await wait_idle(emu)
            assert (emu.bytes_up, emu.bytes_down, emu.connections) == (n * size, n * size, n)
        for sent, back in zip(payloads, got):
            assert back == sent
    run(main())


def test_cut_after_bytes_closes_connection_and_keeps_serving():
    cfg = LinkConfig(cut_after_bytes=3000)

    async def main():
        async with EchoServer() as srv, LinkEmulator(cfg, upstream_port=srv.port) as emu:
            reader, writer = await asyncio.open_connection("127.0.0.1", emu.port)
            writer.write(os.urandom(10_000))
            got, how = await read_until_closed(reader)
            writer.close()
            assert how in ("eof", "reset") and len(got) < 10_000
            await wait_idle(emu)
            assert emu.bytes_up + emu.bytes_down == 3000
            # A new connection under the budget works normally.
            assert await echo_roundtrip(emu.port, b"x" * 100) == b"x" * 100
            assert emu.connections == 2
    run(main())


def test_cut_after_s_closes_open_connections_and_keeps_serving():
    cfg = LinkConfig(cut_after_s=0.4)

    async def main():
        loop = asyncio.get_running_loop()
        async with EchoServer() as srv, LinkEmulator(cfg, upstream_port=srv.port) as emu:
            t0 = loop.time()
            reader, writer = await asyncio.open_connection("127.0.0.1", emu.port)
            writer.write(b"ping")
            assert await reader.readexactly(4) == b"ping"
            _, how = await read_until_closed(reader)  # blocks until the cut
            writer.close()
            assert how in ("eof", "reset")
            assert 0.35 < loop.time() - t0 < 2.0
            await wait_idle(emu)
            assert await echo_roundtrip(emu.port, b"after the cut") == b"after the cut"
    run(main())


def test_unreachable_upstream_closes_client(caplog):
    async def main():
        probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        dead_port = probe.sockets[0].getsockname()[1]
        probe.close()
        await probe.wait_closed()
        async with LinkEmulator(LinkConfig(), upstream_port=dead_port) as emu:
            reader, writer = await asyncio.open_connection("127.0.0.1", emu.port)
            _, how = await read_until_closed(reader)
            writer.close()
            assert how in ("eof", "reset")
            await wait_idle(emu)
    run(main())
    assert any("unreachable" in r.getMessage() for r in caplog.records)


def _pingpong_time(loss: float, rounds: int = 20) -> tuple[float, int]:
    d = DirectionConfig(delay_s=0.005, loss=loss, rto_s=0.05)
    cfg = LinkConfig(up=d, down=d, seed=7)

    async def main():
        loop = asyncio.get_running_loop()
        async with EchoServer() as srv, LinkEmulator(cfg, upstream_port=srv.port) as emu:
            reader, writer = await asyncio.open_connection("127.0.0.1", emu.port)
            t0 = loop.time()
            for _ in range(rounds):
                writer.write(b"0123456789")
                await reader.readexactly(10)
            elapsed = loop.time() - t0
            writer.close()
            return elapsed, sum(emu.segments_lost.values())
    return run(main())


def test_loss_adds_deterministic_stalls():
    base, base_lost = _pingpong_time(0.0)
    t1, lost1 = _pingpong_time(0.25)
    t2, lost2 = _pingpong_time(0.25)
    assert base_lost == 0
    assert lost1 == lost2 > 0  # same seed, same stalls
    # Every stall in a ping-pong adds one full rto (0.05 s) to the run's 20 round trips of 2 x 5 ms
    # (sleeps never end early: the lower bound is exact; the upper one leaves a loaded machine room).
    for t in (t1, t2):
        assert t >= 20 * 2 * 0.005 + lost1 * 0.05
        assert t < base + lost1 * 0.05 + 0.5


def test_stop_with_open_connections_is_clean(caplog):
    d = DirectionConfig(rate_bps=50_000, delay_s=0.05)
    caplog.set_level(logging.INFO)

    async def main():
        async with EchoServer() as srv:
            emu = LinkEmulator(LinkConfig(up=d, down=d), upstream_port=srv.port)
            await emu.start()
            writers = []
            for _ in range(3):  # connections with data still queued in the emulator
                _, w = await asyncio.open_connection("127.0.0.1", emu.port)
                w.write(bytes(20_000))
                writers.append(w)
            deadline = asyncio.get_running_loop().time() + 10
            while emu.active_connections < 3 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)
            assert emu.active_connections == 3
            await emu.stop()
            assert emu.active_connections == 0
            for w in writers:
                w.close()
            await asyncio.sleep(0.05)
        leftover = [t for t in asyncio.all_tasks()
                    if "_Direction" in repr(t) or "_Connection" in repr(t)]
        assert not leftover
    run(main())
    gc.collect()
    bad = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not bad, [r.getMessage() for r in bad]


# ---------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="splitspec sim")
    add_link_commands(parser.add_subparsers(dest="command", required=True))
    return parser


def test_cli_link_check_json(capsys):
    args = _parser().parse_args(["link-check", "--scenario", "wan", "--up", "20mbit",
                                 "--delay", "10ms", "--jitter", "0ms", "--bulk-bytes", "100000",
                                 "--pings", "3", "--json"])
    assert args.func(args) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["rate_bps_configured"] == 20_000_000
    assert r["rtt_ms_configured"] == pytest.approx(20.0)
    assert 18.0 < r["rtt_ms_measured"] < 40.0


def test_cli_bad_flags_exit_2(capsys):
    p = _parser()
    args = p.parse_args(["link", "--listen", "0", "--upstream", "127.0.0.1:1", "--up", "fast"])
    assert args.func(args) == 2
    assert "bad rate" in capsys.readouterr().err
    args = p.parse_args(["link-check", "--scenario", "dialup"])
    assert args.func(args) == 2
    assert "unknown scenario" in capsys.readouterr().err


def test_cli_link_runs_until_sigterm():
    code = ("import argparse, sys\n"
            "from sim.commands.link import add_link_commands\n"
            "p = argparse.ArgumentParser()\n"
            "add_link_commands(p.add_subparsers(dest='c', required=True))\n"
            "a = p.parse_args(sys.argv[1:])\n"
            "sys.exit(a.func(a))\n")

    async def main():
        async with EchoServer() as srv:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", code, "link", "--listen", "127.0.0.1:0",
                "--upstream", f"127.0.0.1:{srv.port}", "--delay", "2ms", "--up", "10mbit",
                cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            line = (await proc.stdout.readline()).decode()
            assert line.startswith("listening on 127.0.0.1:"), line
            port = int(line.split()[2].rsplit(":", 1)[1])
            assert await echo_roundtrip(port, b"hello" * 1000) == b"hello" * 1000
            proc.send_signal(signal.SIGTERM)
            out, err = await proc.communicate()
            assert proc.returncode == 0, err.decode()
            assert "stopped: 1 connection(s), up 5000 B, down 5000 B" in out.decode()
            assert "Traceback" not in err.decode()
            assert "conn 1 closed: up=5000 B down=5000 B" in err.decode()
    run(main())


def test_scenario_override_keeps_other_fields():
    args = _parser().parse_args(["link-check", "--scenario", "lte", "--delay", "1ms"])
    from sim.commands.link import config_from_args
    cfg = config_from_args(args)
    lte = load_scenario("lte").link
    assert cfg.up.delay_s == cfg.down.delay_s == 0.001
    assert cfg.up == dataclasses.replace(lte.up, delay_s=0.001)


def test_burst_stalls_hold_what_arrives_during_one_until_it_ends():
    cfg = DirectionConfig(delay_s=0.05, stall_every_s=2.0, stall_s=0.3)
    stalls = BurstStalls(cfg, seed=7)
    times = [i * 0.01 for i in range(100_000)]  # 1000 s, in order
    held = [stalls.held(t) for t in times]
    bursts = stalls.bursts
    assert 400 <= len(bursts) <= 600  # about one every 2.3 s (2 s apart on average, 0.3 s long)
    for t, h in zip(times, held):
        inside = [end for start, end in bursts if start <= t < end]
        assert h == (inside[0] if inside else t)
    again = BurstStalls(cfg, seed=7)  # seeded: from the same first time, the same bursts, queried in any order
    again.held(times[0])
    assert [again.held(t) for t in reversed(times[:5000])] == list(reversed(held[:5000]))
    assert BurstStalls(DirectionConfig(), seed=7).held(3.0) == 3.0  # none configured: nothing held


def test_a_segment_due_in_a_burst_arrives_as_it_ends():
    cfg = DirectionConfig(delay_s=0.05, stall_every_s=1.0, stall_s=0.5)
    stalls = BurstStalls(cfg, seed=1)
    stalls.held(0.0)
    start, end = stalls.bursts[0]
    _, deliver, _ = schedule_segment(cfg, 100, start - 0.05 + 0.1, 0.0, 0.0, random.Random(0), stalls)
    assert deliver == pytest.approx(end)  # due 0.1 s into the burst: held to its end
    plain = DirectionConfig(delay_s=0.05)
    assert schedule_segment(plain, 100, start + 0.05, 0.0, 0.0, random.Random(0))[1] == pytest.approx(start + 0.1)
    mobile = load_scenario("lte-mobile").link
    assert mobile.up.stalls and mobile.down.stall_s == pytest.approx(0.25) and "stalls 250ms" in mobile.up.describe()
