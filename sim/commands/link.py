"""`link` and `link-check` subcommands (attached under `splitspec sim`).

Contract. `add_link_commands(subparsers)` adds both commands to an argparse
subparsers object and sets `func=(args) -> int exit code` on each. Only
argparse is imported at module import; the emulator loads when a command runs.

Link flags are shared: `--scenario NAME|PATH` gives a base config and any of
`--up/--down/--delay/--jitter/--loss/--rto/--seed/--cut-after/--cut-after-bytes`
given explicitly override it (`--delay`, `--jitter`, `--loss`, `--rto` apply
to both directions). Without a scenario, the base is a transparent link.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_link_commands"]


def add_link_commands(subparsers: Any) -> None:
    """Add `link` and `link-check` to an argparse subparsers object."""
    p = subparsers.add_parser(
        "link", help="run the link emulator as a standalone TCP proxy",
        description="Relay TCP connections from --listen to --upstream through an emulated "
                    "link (bandwidth, delay, jitter, loss). Runs until Ctrl-C or SIGTERM.")
    p.add_argument("--listen", required=True, metavar="[HOST:]PORT",
                   help="address to listen on (host defaults to 127.0.0.1; port 0 = any)")
    p.add_argument("--upstream", required=True, metavar="HOST:PORT",
                   help="server to relay to, e.g. the cloud verifier")
    _add_link_flags(p)
    p.set_defaults(func=run_link)

    c = subparsers.add_parser(
        "link-check", help="measure the rate and RTT an emulated link delivers",
        description="Start a loopback sink behind the emulator and measure payload throughput "
                    "(up direction) and median RTT against the configuration.")
    _add_link_flags(c)
    c.add_argument("--bulk-bytes", type=int, default=None,
                   help="bytes to push for the rate test (default: about 3 s worth)")
    c.add_argument("--pings", type=int, default=10, help="round trips for the RTT median")
    c.add_argument("--json", action="store_true", help="print JSON instead of a table")
    c.set_defaults(func=run_link_check)


def _add_link_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("link (override the scenario)")
    g.add_argument("--scenario", metavar="NAME|PATH",
                   help="shipped scenario name (acespec-50k, lte, wan, satellite) or .toml path")
    g.add_argument("--up", metavar="RATE", help="client->upstream rate (50kbit; 0 = unlimited)")
    g.add_argument("--down", metavar="RATE", help="upstream->client rate, e.g. 50kbit")
    g.add_argument("--delay", metavar="DUR", help="one-way delay each direction, e.g. 50ms")
    g.add_argument("--jitter", metavar="DUR", help="jitter each direction, e.g. 2ms")
    g.add_argument("--loss", type=float, metavar="P", help="loss probability per segment")
    g.add_argument("--rto", metavar="DUR", help="retransmission stall per lost segment")
    g.add_argument("--seed", type=int, help="seed for jitter and loss")
    g.add_argument("--cut-after", metavar="DUR", help="abort all connections at this time")
    g.add_argument("--cut-after-bytes", type=int, metavar="N",
                   help="abort a connection after N payload bytes")


def config_from_args(args: argparse.Namespace):
    """LinkConfig from the shared flags; ValueError on bad values."""
    import dataclasses

    from sim.link.config import LinkConfig, parse_duration, parse_rate
    from sim.link.scenario import load_scenario

    cfg = load_scenario(args.scenario).link if args.scenario else LinkConfig()
    both: dict[str, Any] = {}
    if args.delay is not None:
        both["delay_s"] = parse_duration(args.delay)
    if args.jitter is not None:
        both["jitter_s"] = parse_duration(args.jitter)
    if args.loss is not None:
        both["loss"] = args.loss
    if args.rto is not None:
        both["rto_s"] = parse_duration(args.rto)
    up = dict(both, **({"rate_bps": parse_rate(args.up)} if args.up is not None else {}))
    down = dict(both, **({"rate_bps": parse_rate(args.down)} if args.down is not None else {}))
    top: dict[str, Any] = {
        "up": dataclasses.replace(cfg.up, **up),
        "down": dataclasses.replace(cfg.down, **down),
    }
    if args.seed is not None:
        top["seed"] = args.seed
    if args.cut_after is not None:
        top["cut_after_s"] = parse_duration(args.cut_after)
    if args.cut_after_bytes is not None:
        top["cut_after_bytes"] = args.cut_after_bytes
    return dataclasses.replace(cfg, **top)


def _host_port(text: str, default_host: str | None) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep:
        if default_host is None:
            raise ValueError(f"expected HOST:PORT, got {text!r}")
        host = default_host
    try:
        n = int(port)
    except ValueError:
        raise ValueError(f"bad port in {text!r}") from None
    if not 0 <= n <= 65535:
        raise ValueError(f"port out of range in {text!r}")
    return host.strip("[]") or (default_host or "127.0.0.1"), n


def _error(command: str, e: Exception) -> int:
    print(f"splitspec sim {command}: error: {e}", file=sys.stderr)
    return 2


def run_link(args: argparse.Namespace) -> int:
    """`link`: proxy until SIGINT/SIGTERM; 0 on a clean stop, 2 on bad flags, 1 on bind failure."""
    import asyncio
    import logging

    try:
        cfg = config_from_args(args)
        listen_host, listen_port = _host_port(args.listen, "127.0.0.1")
        up_host, up_port = _host_port(args.upstream, None)
    except ValueError as e:
        return _error("link", e)
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    link_log = logging.getLogger("sim.link.emulator")
    if link_log.getEffectiveLevel() > logging.INFO:
        link_log.setLevel(logging.INFO)  # connection logs are this command's output
    try:
        return asyncio.run(_serve(cfg, listen_host, listen_port, up_host, up_port))
    except OSError as e:
        return _error("link", e)


async def _serve(cfg, listen_host: str, listen_port: int, up_host: str, up_port: int) -> int:
    import asyncio
    import signal

    from sim.link.emulator import LinkEmulator

    emu = LinkEmulator(cfg, listen_host, listen_port, up_host, up_port)
    await emu.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread, or no signals
            pass
    print(f"listening on {listen_host}:{emu.port} -> {up_host}:{up_port}; "
          f"up {cfg.up.describe()}; down {cfg.down.describe()}", flush=True)
    try:
        await stop.wait()
    finally:
        await emu.stop()
    print(f"stopped: {emu.connections} connection(s), up {emu.bytes_up} B, "
          f"down {emu.bytes_down} B, stalls up {emu.segments_lost['up']} "
          f"down {emu.segments_lost['down']}", flush=True)
    return 0


def run_link_check(args: argparse.Namespace) -> int:
    """`link-check`: print the measurement as a table or JSON; 0 on success, 2 on bad flags."""
    import asyncio

    from sim.link.check import format_link_check, link_check

    try:
        cfg = config_from_args(args)
        result = asyncio.run(link_check(cfg, bulk_bytes=args.bulk_bytes, pings=args.pings))
    except ValueError as e:
        return _error("link-check", e)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(format_link_check(result))
    return 0
