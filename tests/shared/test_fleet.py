"""MQTT fleet telemetry and control against a real broker process (``splitspec fleet broker``,
amqtt): retained status for late subscribers, the will on kill -9, commands applied once,
cloud load and its suggested draft length, and a broker restart that costs a running
generation nothing."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from helpers import make_certificate, tiny_drafter, tiny_prompt

from cloud.limits import ServiceLimits
from cloud.server import BackgroundServer, ServerConfig
from edge.schedule import SpecConfig
from edge.serving import EdgeService, Job, ServeConfig
from edge.telemetry import EdgeFleet, GenerationSample, telemetry_document
from shared.fleet import (
    DEFAULT_BUDGET_BPS,
    DEFAULT_TELEMETRY_PERIOD_S,
    PASSWORD_ENV,
    Broker,
    ByteBudget,
    FleetClient,
    parse_mqtt_url,
)
from shared.fleet_commands import sign
from shared.params import Mode, SamplingParams
from sim.experiment.processes import BrokerProcess
from sim.fleet.broker import hash_password
from sim.fleet.watch import watch_once
from sim.inprocess import generate


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def broker():
    made = BrokerProcess().start()
    yield made
    made.kill()


def wait_for(predicate, timeout_s: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_urls_and_the_byte_budget():
    assert parse_mqtt_url("mqtt://broker.local") == Broker("broker.local", 1883)
    assert parse_mqtt_url("10.0.0.2:1884") == Broker("10.0.0.2", 1884)
    assert parse_mqtt_url("mqtts://edge-1:p%40ss@b.local?ca=/etc/ca.pem") == Broker(
        "b.local", 8883, tls=True, ca_file="/etc/ca.pem", username="edge-1", password="p@ss")
    for bad in ("http://x", "mqtt://", "mqtt://h:99999", "mqtt://h?ca=/ca.pem", "mqtts://h?cafile=x", "mqtts://h?ca=a&ca=b"):
        with pytest.raises(ValueError):
            parse_mqtt_url(bad)
    with pytest.raises(ValueError) as error:  # an error names the URL, never its password
        parse_mqtt_url("mqtts://edge-1:s3cret@h:99999")
    assert "s3cret" not in str(error.value) and "edge-1:***@h:99999" in str(error.value)
    now = [0.0]
    budget = ByteBudget(800, burst_s=1.0, clock=lambda: now[0])  # 100 B/s, 100 B of burst
    assert budget.take(100) and not budget.take(1)
    now[0] = 0.5
    assert budget.take(50) and not budget.take(10)
    # A full telemetry document at the default period stays within 2% of a 50 kbit/s uplink.
    sample = GenerationSample(tokens=64, wall_s=3.0, mode="coupled", draft_len=8, window=2, served_by="split",
                              replica="host-50051", rtt_ms=101.3, bytes_up=4000, bytes_down=3000,
                              accepted_at=[50] * 8, drafted_at=[60] * 8)
    payload = json.dumps(telemetry_document([sample], {"generations": 12, "tokens": 900}), separators=(",", ":"))
    per_message = len(payload) + len("splitspec/v1/edge/host-12345/telemetry") + 60
    assert per_message * 8 / DEFAULT_TELEMETRY_PERIOD_S <= 0.02 * 50_000 <= DEFAULT_BUDGET_BPS


def _state(view: dict, ident: str) -> str | None:
    """The retained status's state of ``ident`` in a ``watch_once`` view (None: not seen yet)."""
    return view.get(ident, {}).get("status", {}).get("state")


def test_a_late_subscriber_sees_retained_status_and_a_clean_stop_says_offline(broker):
    client = FleetClient(broker.url, "edge", "late-test").start()
    client.set_status(state="online", model="tiny")
    wait_for(client.connected.is_set, what="connection")
    view = wait_for(lambda: watch_once(broker.url, 0.5)["edges"].get("late-test"), what="retained status")
    assert view["status"]["state"] == "online" and view["status"]["model"] == "tiny"
    client.stop()
    wait_for(lambda: _state(watch_once(broker.url, 0.5)["edges"], "late-test") == "offline", what="offline")


def test_kill_9_of_an_edge_publishes_offline_through_its_will(broker, tiny_models, serve):
    cloud = serve()
    edge = subprocess.Popen(
        [sys.executable, "-m", "edge.cli", "serve", "--cloud", cloud.address, "--drafter",
         tiny_models["drafter_f32"], "--port", str(free_port()), "--mqtt", broker.url, "--edge-id", "doomed",
         "--drafter-ctx", "512"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for(lambda: _state(watch_once(broker.url, 0.3)["edges"], "doomed") == "online", timeout_s=60,
                 what="the edge online")
        os.kill(edge.pid, signal.SIGKILL)
        edge.wait(10)
        wait_for(lambda: _state(watch_once(broker.url, 0.3)["edges"], "doomed") == "offline", what="the will")
    finally:
        if edge.poll() is None:
            edge.kill()


KEY = b"fleet-test-key-0123456789abcdef"


def test_a_command_is_applied_once_even_when_redelivered(broker):
    fleet = EdgeFleet(broker.url, "cmd-test", period_s=60, command_key=KEY).start()
    sender = FleetClient(broker.url, "edge", "operator").start()
    try:
        wait_for(lambda: fleet.client.connected.is_set() and sender.connected.is_set(), what="connections")
        command = sign("c-1", {"max_draft_len": 3, "mode": "rejection"}, KEY)
        for _ in range(3):  # QoS 1 is at least once: the same id may come again
            sender.publish_to("splitspec/v1/edge/cmd-test/cmd", command)
        wait_for(lambda: fleet.client.counts.commands_applied, what="the command")
        time.sleep(0.5)
        assert fleet.client.counts.commands_applied == 1
        assert fleet.max_draft_len == 3 and fleet.mode is Mode.REJECTION
        assert fleet.draft_len_cap("any", 8) == 3
        sender.publish_to("splitspec/v1/edge/cmd-test/cmd", sign("c-2", {"max_draft_len": 0}, KEY))
        time.sleep(0.5)
        assert fleet.client.counts.commands_applied == 1 and fleet.max_draft_len == 3  # refused, not applied
    finally:
        sender.stop()
        fleet.stop()


def test_only_commands_signed_with_the_fleet_key_and_fresh_are_applied(broker):
    """Anyone on the broker can publish; only a holder of the key can steer an edge (and not with a command
    captured earlier). The control: the same command, signed and fresh, is applied."""
    fleet = EdgeFleet(broker.url, "guarded", period_s=60, command_key=KEY).start()
    keyless = EdgeFleet(broker.url, "keyless", period_s=60).start()  # no key: no commands at all
    sender = FleetClient(broker.url, "edge", "anyone").start()
    try:
        clients = (fleet.client, keyless.client, sender)
        wait_for(lambda: all(client.connected.is_set() for client in clients), what="connections")
        forged = [{"id": "f-1", "set": {"max_draft_len": 1}},  # unsigned
                  sign("f-2", {"max_draft_len": 1}, b"another-key-0123456789abcdef"),  # another key
                  sign("f-3", {"max_draft_len": 1}, KEY, now=time.time() - 3600),  # an hour old
                  {**sign("f-4", {"max_draft_len": 9}, KEY), "set": {"max_draft_len": 1}}]  # altered after signing
        for command in forged:
            sender.publish_to("splitspec/v1/edge/guarded/cmd", command)
        sender.publish_to("splitspec/v1/edge/keyless/cmd", sign("k-1", {"max_draft_len": 1}, KEY))
        time.sleep(1.0)
        assert fleet.client.counts.commands_applied == 0 and fleet.max_draft_len is None
        assert keyless.client.counts.commands_applied == 0 and keyless.max_draft_len is None
        sender.publish_to("splitspec/v1/edge/guarded/cmd", sign("ok-1", {"max_draft_len": 2}, KEY))
        wait_for(lambda: fleet.max_draft_len == 2, what="the signed command")
    finally:
        sender.stop()
        keyless.stop()
        fleet.stop()


def test_an_operator_command_from_the_cli_reaches_the_edge(broker, tmp_path):
    key_file = tmp_path / "fleet.key"
    key_file.write_bytes(KEY + b"\n")
    fleet = EdgeFleet(broker.url, "steered", period_s=60, command_key=KEY).start()
    try:
        wait_for(fleet.client.connected.is_set, what="connection")  # (set once subscribed)
        send = [sys.executable, "-m", "sim.cli", "fleet", "send", "--mqtt", broker.url, "--edge", "steered"]
        sent = subprocess.run([*send, "--key-file", str(key_file), "--set", "max_draft_len=5"], capture_output=True,
                              text=True, timeout=60)
        assert sent.returncode == 0 and "sent command" in sent.stdout, sent.stderr
        wait_for(lambda: fleet.max_draft_len == 5, what="the command")
        bad = subprocess.run([*send, "--key-file", str(key_file), "--set", "speed=11"], capture_output=True, text=True,
                             timeout=60)
        assert bad.returncode == 2 and "NAME=VALUE" in bad.stderr and "Traceback" not in bad.stderr
        short = tmp_path / "short.key"
        short.write_text("abc")
        weak = subprocess.run([*send, "--key-file", str(short), "--set", "max_draft_len=4"], capture_output=True,
                              text=True, timeout=60)
        assert weak.returncode == 2 and "needs 16 at least" in weak.stderr and "Traceback" not in weak.stderr
    finally:
        fleet.stop()


def test_the_cloud_publishes_its_load_and_edges_follow_its_suggestion(broker, tiny_engine):
    limits = ServiceLimits(max_draft_len=16, max_sessions=4)
    config = ServerConfig(port=0, limits=limits, replica="r1", mqtt_url=broker.url)
    with BackgroundServer(tiny_engine, config):
        view = wait_for(lambda: watch_once(broker.url, 0.5)["clouds"].get("r1", {}).get("load"), what="load")
        assert view["suggested_max_draft_len"] == 16 and view["free_slots"] == 4
        assert view["row_tile_reproducible"] >= view["row_tile"] >= 1  # a CPU verifier says its tiles
        fleet = EdgeFleet(broker.url, "follower", period_s=60).start()
        try:
            wait_for(lambda: fleet.suggested.get("r1"), what="the suggestion")
            assert fleet.draft_len_cap("r1", 8) == 8 and fleet.draft_len_cap("r1", 32) == 16
        finally:
            fleet.stop()
    wait_for(lambda: _state(watch_once(broker.url, 0.5)["clouds"], "r1") == "offline", what="offline")


def test_a_broker_restart_mid_generation_loses_no_tokens(broker, tiny_models, tiny_engine):
    drafter = tiny_drafter(tiny_models, "drafter_f32")
    params = SamplingParams(mode=Mode.GREEDY)
    prompt = tiny_prompt(tiny_engine, "The cat sat on the mat.")
    want = generate(tiny_engine, drafter, prompt, params, max_new_tokens=150, spec=SpecConfig(0)).tokens
    fleet = EdgeFleet(broker.url, "steady", period_s=0.2).start(state="online")
    idle = FleetClient(broker.url, "cloud", "idle").start()  # publishes nothing after connecting
    try:
        with BackgroundServer(tiny_engine, ServerConfig(port=0)) as cloud:
            service = EdgeService.for_drafter(drafter, ServeConfig(cloud=cloud.address, model_name="tiny", draft_len=2),
                                              "gemma", fleet)
            wait_for(fleet.client.connected.is_set, what="connection")
            texts: list[str] = []

            def slow(text: str) -> None:
                texts.append(text)
                time.sleep(0.01)

            outcome = {}
            worker = threading.Thread(target=lambda: outcome.update(
                out=service.run(Job(prompt, params, 150), slow, threading.Event())))
            worker.start()
            wait_for(lambda: texts, what="the first tokens")
            broker.kill()
            broker.start()  # same port, retained messages gone
            worker.join(120)
            assert outcome["out"].tokens == want
            wait_for(lambda: fleet.client.counts.connections >= 2, timeout_s=30, what="the reconnection")
            status = wait_for(lambda: watch_once(broker.url, 0.5)["edges"].get("steady", {}).get("status"),
                              what="status republished")
            assert status["state"] == "online"
            # A client with nothing to send notices the lost broker too, and is back.
            wait_for(lambda: idle.counts.connections >= 2, timeout_s=30, what="the idle client's reconnection")
            assert wait_for(lambda: watch_once(broker.url, 0.5)["clouds"].get("idle"), what="idle status")
    finally:
        idle.stop()
        fleet.stop()
        drafter.close()


def test_a_broker_with_tls_and_passwords_lets_in_only_its_users_and_only_over_tls(tmp_path, monkeypatch):
    """``fleet broker --tls-cert --tls-key --users``: a listed user with its password over TLS gets in (and
    reads the fleet); a wrong password, no user, or the right password in the clear do not."""
    make_certificate(tmp_path)  # (cert.pem and key.pem, for localhost and 127.0.0.1)
    cert, key, users = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "users"
    users.write_text(hash_password("edge-1", "pw-edge-1") + "\n" + hash_password("operator", "pw-op") + "\n")
    with BrokerProcess(security_args=("--tls-cert", str(cert), "--tls-key", str(key), "--users", str(users))) as broker:
        address = f"127.0.0.1:{broker.port}"
        monkeypatch.setenv(PASSWORD_ENV, "pw-edge-1")  # a user without a password in the URL takes it from here
        urls = {"listed": f"mqtts://edge-1@{address}?ca={cert}",
                "wrong password": f"mqtts://edge-1:nope@{address}?ca={cert}",
                "no user": f"mqtts://{address}?ca={cert}",
                "in the clear": f"mqtt://edge-1:pw-edge-1@{address}"}
        clients = {what: FleetClient(url, "edge", what.replace(" ", "-")).start() for what, url in urls.items()}
        try:
            assert clients["listed"].connected.wait(15), "a listed user over TLS did not get in"
            time.sleep(2.0)  # (the others have had their tries by now)
            assert [what for what, client in clients.items() if client.connected.is_set()] == ["listed"]
            view = watch_once(f"mqtts://operator:pw-op@{address}?ca={cert}", settle_s=1.5)
            assert _state(view["edges"], "listed") == "online" and set(view["edges"]) == {"listed"}
        finally:
            for client in clients.values():
                client.stop(timeout_s=2.0)
