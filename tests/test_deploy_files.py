"""docker-compose.yml and the Dockerfile stay in step with the code, the CLI and the packaging."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

import cloud.cli
import edge.cli
import sim.cli

ROOT = Path(__file__).resolve().parents[1]
# Each console script of pyproject.toml and the parser behind it.
PARSERS = {"splitspec": sim.cli.build_parser, "splitspec-cloud": cloud.cli.build_parser, "splitspec-edge": edge.cli.build_parser}


def _dockerfile_instructions(name: str = "Dockerfile") -> list[tuple[str, list[str]]]:
    """(INSTRUCTION, arguments) per Dockerfile instruction, continuation lines joined, comments dropped;
    exec-form (JSON array) arguments are parsed as JSON."""
    text = "\n".join(line for line in (ROOT / name).read_text().splitlines() if not line.lstrip().startswith("#"))
    out = []
    for instruction in text.replace("\\\n", " ").splitlines():
        if instruction.strip():
            word, _, rest = instruction.strip().partition(" ")
            rest = rest.strip()
            out.append((word.upper(), json.loads(rest) if rest.startswith("[") else shlex.split(rest)))
    return out


def test_console_scripts_are_the_parsers_the_tests_use():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == set(PARSERS)
    for name, target in scripts.items():
        module, function = target.split(":")
        assert function == "main" and PARSERS[name].__module__ == module, name


def test_compose_commands_parse_with_the_real_cli():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"cloud", "link", "edge", "edge-serve", "broker"} <= set(services)
    entrypoint = dict(_dockerfile_instructions())["ENTRYPOINT"]
    for name, service in services.items():
        if "build" not in service:  # a stock image (the MQTT broker)
            continue
        script = (service.get("entrypoint") or entrypoint)[0]
        args = PARSERS[script]().parse_args(service["command"])  # SystemExit on any flag the CLI does not know
        assert callable(args.func), name
    assert services["cloud"]["entrypoint"] == ["splitspec-cloud"]
    assert services["edge"]["entrypoint"] == ["splitspec-edge"]
    link_args = PARSERS["splitspec"]().parse_args(services["link"]["command"])
    assert link_args.upstream == "cloud:50051"
    edge_args = PARSERS["splitspec-edge"]().parse_args(services["edge"]["command"])
    assert edge_args.cloud == "link:50052"
    serve_args = PARSERS["splitspec-edge"]().parse_args(services["edge-serve"]["command"])
    assert (serve_args.cloud, serve_args.port, serve_args.host) == ("link:50052", 8080, "0.0.0.0")
    assert services["edge-serve"]["ports"] == ["8080:8080"]
    mqtt = {args.mqtt for args in (edge_args, serve_args, PARSERS["splitspec-cloud"]().parse_args(
        services["cloud"]["command"]))}
    assert mqtt == {"mqtt://broker:1883"} and services["broker"]["image"].startswith("eclipse-mosquitto")


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.gpu"])
def test_dockerfile_copies_every_package_and_pins_torch_as_the_makefile_does(dockerfile):
    packaged = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    copies = {tuple(args) for word, args in _dockerfile_instructions(dockerfile) if word == "COPY"}
    for pattern in packaged:
        package = pattern.rstrip("*")
        assert (package, package) in copies, f"{dockerfile} does not COPY {package}"
    runs = " ".join(" ".join(args) for word, args in _dockerfile_instructions(dockerfile) if word == "RUN")
    makefile_pin = next(word for word in (ROOT / "Makefile").read_text().split() if word.startswith("torch=="))
    assert makefile_pin in runs.split()


def test_the_edges_wait_for_a_healthy_verifier():
    """Compose starts an edge only once the verifier's gRPC health check passes; edge-serve's own check is
    its /health (503 until its verifier answers). ``docker-compose config`` validates the file where installed."""
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for verifier in ("cloud", "cloud-1", "cloud-2"):
        assert "HealthStub" in " ".join(services[verifier]["healthcheck"]["test"]), verifier
    for edge_service in ("edge", "edge-serve"):
        assert services[edge_service]["depends_on"]["cloud"]["condition"] == "service_healthy", edge_service
    assert {services["verifiers"]["depends_on"][name]["condition"] for name in ("cloud-1", "cloud-2")} == {"service_healthy"}
    assert "localhost:8080/health" in " ".join(services["edge-serve"]["healthcheck"]["test"])
    if shutil.which("docker-compose"):
        checked = subprocess.run(["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
                                 capture_output=True, text=True, timeout=60)
        assert checked.returncode == 0, checked.stderr


def test_replicas_sit_behind_a_proxy_that_routes_resumes_by_replica():
    from shared.wire import REPLICA_HEADER

    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    envoy = yaml.safe_load((ROOT / "deploy" / "envoy.yaml").read_text())
    routes = envoy["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"][
        "route_config"]["virtual_hosts"][0]["routes"]
    routed = {route["match"]["headers"][0]["string_match"]["exact"]: route["route"]["cluster"]
              for route in routes if "headers" in route["match"]}
    assert {route["match"]["headers"][0]["name"] for route in routes if "headers" in route["match"]} == {REPLICA_HEADER}
    clusters = {c["name"]: c for c in envoy["static_resources"]["clusters"]}
    for name in ("cloud-1", "cloud-2"):
        args = PARSERS["splitspec-cloud"]().parse_args(services[name]["command"])
        assert args.replica == name and services[name]["profiles"] == ["replicas"]
        # the named replica first; when it is gone, any replica (whose NOT_FOUND makes the edge reopen)
        assert clusters[routed[name]]["cluster_type"]["typed_config"]["clusters"] == [name, "verifiers"]
    assert routes[-1]["route"]["cluster"] == "verifiers"  # new sessions: either replica
    hosts = [e["endpoint"]["address"]["socket_address"]["address"]
             for e in clusters["verifiers"]["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert hosts == ["cloud-1", "cloud-2"]
