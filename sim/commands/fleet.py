"""``splitspec fleet ...``: the embedded MQTT broker and the fleet view (flags only)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from shared.cli import MQTT_URL_FORMS, mqtt_url, port_number, positive_float

__all__ = ["add_fleet_commands"]


def add_fleet_commands(commands) -> None:
    broker = commands.add_parser(
        "broker", help="run an embedded MQTT broker (amqtt) for laptops, demos and tests",
        description="A pure-Python MQTT broker, retained messages in memory: anonymous and in the clear by "
        "default; with --users only those users with their passwords, with --tls-cert/--tls-key over TLS only "
        "(clients then connect to mqtts://USER@HOST:PORT). Fleets in production run their own (mosquitto, EMQX) "
        "and pass its URL to --mqtt.")
    broker.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    broker.add_argument("--port", type=port_number, default=None, help="listen port (default 1883, 8883 with TLS)")
    broker.add_argument("--tls-cert", type=Path, default=None, help="PEM certificate: MQTT over TLS (with --tls-key)")
    broker.add_argument("--tls-key", type=Path, default=None, help="... and its PEM private key")
    broker.add_argument("--users", type=Path, default=None,
                        help="only these users, with their passwords: a file of 'user:hash' lines (splitspec fleet "
                        "user NAME writes one)")
    broker.set_defaults(func=run_broker)

    user = commands.add_parser(
        "user", help="a line for the broker's --users file: NAME and a password read from stdin",
        description="Reads a password from the terminal (or one line of stdin) and prints 'NAME:<Argon2 hash>' for "
        "the broker's --users file. The client gives the password in $SPLITSPEC_MQTT_PASSWORD with "
        "--mqtt mqtts://NAME@HOST.")
    user.add_argument("name", help="the user name (an edge's, a verifier's, an operator's)")
    user.set_defaults(func=run_user)

    watch = commands.add_parser(
        "watch", help="a live view of every edge and verifier replica on the broker",
        description="Subscribes to splitspec/v1/# and shows each edge (state, tokens/s, acceptance by position, "
        "D, W, RTT) and each verifier replica (state, sessions, free slots, verify latency, suggested D).")
    watch.add_argument("--mqtt", type=mqtt_url, required=True, metavar="URL", help=f"the broker ({MQTT_URL_FORMS})")
    watch.add_argument("--once", action="store_true", help="collect for --settle seconds, print the view, exit")
    watch.add_argument("--settle", type=positive_float, default=1.0, help="--once: seconds to listen (default 1)")
    watch.add_argument("--json", action="store_true", help="--once: print the view as JSON")
    watch.set_defaults(func=run_watch)

    send = commands.add_parser(
        "send", help="send a command to one edge (applied once, between its requests)",
        description="Publishes {\"id\", \"set\": {...}} to splitspec/v1/edge/ID/cmd at QoS 1. An edge applies each "
        "command id once, signed with the fleet's key and sent within the last 5 minutes: max_draft_len caps its "
        "draft length, mode sets the mode of sampled requests (coupled or rejection).")
    send.add_argument("--mqtt", type=mqtt_url, required=True, metavar="URL", help=f"the broker ({MQTT_URL_FORMS})")
    send.add_argument("--edge", required=True, metavar="ID", help="the edge's id (its --edge-id)")
    send.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                      help="max_draft_len=N or mode=coupled|rejection (repeatable)")
    send.add_argument("--id", default=None, help="the command id (default: random); resending an id is a no-op")
    send.add_argument("--key-file", type=Path, required=True,
                      help="the fleet's command key (the edges' --fleet-key-file): the command is signed with it, "
                           "and an edge applies only commands signed with its key")
    send.set_defaults(func=run_send)


def run_broker(args: argparse.Namespace) -> int:
    import asyncio

    from sim.fleet.broker import BrokerSecurity
    from sim.fleet.broker import run_broker as serve

    security = BrokerSecurity(args.tls_cert, args.tls_key, args.users)
    port = args.port or (8883 if security.tls_cert else 1883)
    asyncio.run(serve(args.host, port, ready=lambda url: print(f"splitspec fleet: broker on {url}", flush=True),
                      security=security))
    return 0


def run_user(args: argparse.Namespace) -> int:
    import getpass
    import sys

    from sim.fleet.broker import hash_password

    password = getpass.getpass(f"password for {args.name}: ") if sys.stdin.isatty() else sys.stdin.readline().rstrip("\n")
    print(hash_password(args.name, password))
    return 0


def run_watch(args: argparse.Namespace) -> int:
    from sim.fleet.watch import watch_live, watch_once

    if not args.once:
        watch_live(args.mqtt)
        return 0
    view = watch_once(args.mqtt, args.settle)
    if args.json:
        print(json.dumps(view))
    else:
        for kind in ("clouds", "edges"):
            for name, docs in sorted(view[kind].items()):
                print(f"{kind[:-1]:>5} {name}: " + "; ".join(f"{k} {json.dumps(v)}" for k, v in sorted(docs.items())))
    return 0


def run_send(args: argparse.Namespace) -> int:
    from shared.fleet_commands import read_key_file
    from sim.fleet.command import parse_settings, send_command

    settings = parse_settings(args.set)
    key = read_key_file(args.key_file)
    print(f"sent command {send_command(args.mqtt, args.edge, settings, key, args.id)} to edge {args.edge}: {settings}")
    return 0
