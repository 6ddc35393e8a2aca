"""docker-compose.yml and the Dockerfile stay in step with the code and the CLI."""

from __future__ import annotations

from pathlib import Path

import yaml

from sim.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def test_compose_commands_parse_with_the_real_cli():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"cloud", "link", "edge"} <= set(services)
    parser = build_parser()
    for name, service in services.items():
        args = parser.parse_args(service["command"])  # exits (SystemExit) on any flag the CLI does not know
        assert callable(args.func), name
    assert "cloud:50051" in services["link"]["command"]
    assert "link:50052" in services["edge"]["command"]


def test_dockerfile_copies_every_package():
    dockerfile = (ROOT / "Dockerfile").read_text()
    for package in ("edge", "cloud", "shared", "sim", "protos"):
        assert f"COPY {package} {package}" in dockerfile
    assert "torch==2.13.0" in dockerfile
