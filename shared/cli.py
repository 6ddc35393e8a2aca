"""What every splitspec command line shares: one-line errors, exit codes, logging, number flags.

Exit codes: 0 success, 1 a runtime failure (the cloud went away, a model would
not load), 2 bad input (a flag, a file, a value out of range), 130 interrupted.
A ``CliError``, ``ValueError`` or ``FileNotFoundError`` reaching ``run_command``
prints one line, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

__all__ = [
    "CliError",
    "run_command",
    "add_verbosity",
    "positive_int",
    "non_negative_int",
    "positive_float",
    "non_negative_float",
    "port_number",
    "host_port",
]


class CliError(Exception):
    """A failure the user can act on. ``exit_code`` 2 means bad input."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def port_number(text: str) -> int:
    """A TCP port, 0 (any free port) to 65535."""
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port in [0, 65535], got {value}")
    return value


def host_port(text: str) -> str:
    """HOST:PORT (an IPv6 host in brackets) with a port in [1, 65535]."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or (":" in host and not (host.startswith("[") and host.endswith("]"))):
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (IPv6 as [::1]:PORT), got {text!r}")
    try:
        number = int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"the port in {text!r} is not a number") from None
    if not 1 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"the port in {text!r} must be in [1, 65535]")
    return text


MQTT_URL_FORMS = ("mqtt://HOST[:PORT]; over TLS with a password: mqtts://USER@HOST[:PORT][?ca=CA.pem], the password in "
                  "$SPLITSPEC_MQTT_PASSWORD")  # (the --mqtt flags' help)


def mqtt_url(text: str) -> str:
    """An MQTT broker URL, ``mqtt[s]://[USER@]HOST[:PORT][?ca=PATH]`` (``shared.fleet.parse_mqtt_url``)."""
    from shared.fleet import parse_mqtt_url

    try:
        parse_mqtt_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_verbosity(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")


def run_command(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, set up logging and run ``args.func(args)``; returns the exit code."""
    # torch's OpenMP workers spin between ops by default, starving a llama.cpp
    # drafter in the same process (measured: 6x slower split decoding).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    args = parser.parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    name = parser.prog
    try:
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except (FileNotFoundError, ValueError) as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
