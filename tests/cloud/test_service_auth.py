"""The verifier's doors: bearer-token auth, TLS, and the edge and cloud command lines.

Real servers on loopback, real ``GrpcVerifier``s; the CLI runs as subprocesses.
"""

from __future__ import annotations

import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import make_certificate, tiny_drafter

from cloud.server import SERVICE_NAME, BackgroundServer, ServerConfig
from edge.decode_loop import run_decode
from edge.endpoint import VerifierEndpoint
from edge.grpc_verifier import GrpcVerifier
from edge.schedule import SpecConfig
from edge.verifier_protocol import VerifierError
from protos import splitspec_pb2 as pb
from protos import splitspec_pb2_grpc as pb_grpc
from shared import codec
from shared.params import Mode, SamplingParams
from shared.wire import sampling_to_proto
from sim.inprocess import generate

REPO = Path(__file__).resolve().parents[2]
BOS = 1
PROMPT_TEXT = "We have 3 dogs and 12 cats!"
NEW_TOKENS = 24
GREEDY = SamplingParams(mode=Mode.GREEDY)
TOKEN = "s3cret"


@pytest.fixture(scope="module")
def prompt(tiny_engine):
    return [BOS, *tiny_engine.tokenizer(PROMPT_TEXT, add_special_tokens=False).input_ids]


@pytest.fixture(scope="module")
def drafter(tiny_models):
    made = tiny_drafter(tiny_models, "drafter_f32")
    yield made
    made.close()


@pytest.fixture(scope="module")
def want(tiny_engine, drafter, prompt):
    return generate(tiny_engine, drafter, prompt, GREEDY, max_new_tokens=NEW_TOKENS, spec=SpecConfig(0)).tokens


def decode(address, tiny_vocab, drafter, prompt, **endpoint_args) -> list[int]:
    link = GrpcVerifier(VerifierEndpoint(address, *tiny_vocab, **endpoint_args))
    return run_decode(drafter, link, prompt, GREEDY, max_new_tokens=NEW_TOKENS, spec=SpecConfig(4)).tokens


def health_status(channel, service: str = "") -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


# ---------------------------------------------------------------- bearer token


@pytest.fixture(scope="module")
def auth_server(serve_module):
    server = serve_module(auth_token=TOKEN)
    yield server


@pytest.mark.parametrize("token", [None, "wrong", TOKEN + "x", TOKEN.upper()], ids=["none", "wrong", "longer", "case"])
def test_missing_or_wrong_token_is_unauthenticated(auth_server, tiny_vocab, drafter, prompt, token):
    started = time.perf_counter()
    with pytest.raises(VerifierError, match="UNAUTHENTICATED") as error:
        decode(auth_server.address, tiny_vocab, drafter, prompt, auth_token=token, connect_timeout_s=5)
    assert "bearer token" in str(error.value)
    assert time.perf_counter() - started < 5
    assert len(auth_server.server.servicer.table) == 0  # refused before any session


def test_right_token_decodes_exactly(auth_server, tiny_vocab, drafter, prompt, want):
    assert decode(auth_server.address, tiny_vocab, drafter, prompt, auth_token=TOKEN) == want


def test_cloud_only_generate_needs_the_token_too(auth_server, tiny_vocab, prompt):
    encoded = codec.encode_tokens(prompt, tiny_vocab[0])
    request = pb.GenerateRequest(
        vocab_size=tiny_vocab[0], vocab_fingerprint=tiny_vocab[1], sampling=sampling_to_proto(GREEDY),
        prompt=encoded.data, prompt_compressed=encoded.compressed, max_new_tokens=3,
    )
    with grpc.insecure_channel(auth_server.address) as channel:
        stub = pb_grpc.VerifierStub(channel)
        with pytest.raises(grpc.RpcError) as error:
            list(stub.Generate(request, timeout=10))
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        chunks = list(stub.Generate(request, timeout=10, metadata=(("authorization", f"Bearer {TOKEN}"),)))
        assert chunks[-1].done and len(chunks) == 3


@pytest.mark.parametrize("address", ["10.1.2.3:50051", "example.com:443", "0.0.0.0:50051"])
def test_edge_refuses_to_send_a_token_in_cleartext_off_loopback(address):
    from edge.channel import make_channel

    with pytest.raises(ValueError, match="cleartext.*--tls-ca"):
        make_channel(address, auth_token=TOKEN)
    make_channel(address).close()  # no token: a plaintext channel is fine


@pytest.mark.parametrize("address", ["127.0.0.1:1", "localhost:1", "[::1]:1", "127.8.9.10:1"])
def test_loopback_addresses_are_recognised(address):
    from shared.wire import is_loopback

    assert is_loopback(address)
    assert not is_loopback(address.replace("127.", "128.").replace("localhost", "localhost.example").replace("::1", "::2"))


def test_server_refuses_a_cleartext_token_off_loopback_unless_insecure():
    with pytest.raises(ValueError, match="--tls-cert and --tls-key.*--insecure"):
        ServerConfig(host="0.0.0.0", auth_token=TOKEN)
    assert ServerConfig(host="0.0.0.0", auth_token=TOKEN, insecure=True).insecure
    assert ServerConfig(host="127.0.0.1", auth_token=TOKEN).auth_token == TOKEN
    pem = b"-----BEGIN CERTIFICATE-----\n...\n"
    assert ServerConfig(host="0.0.0.0", auth_token=TOKEN, tls_cert=pem, tls_key=pem).tls_cert == pem


def test_cloud_cli_refuses_a_cleartext_token_with_one_line_and_exit_2(tiny_models, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    result = subprocess.run(
        [sys.executable, "-m", "cloud.cli", "serve", "--target", tiny_models["target"], "--host", "0.0.0.0",
         "--port", "0", "--auth-token-file", str(token_file)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "--insecure" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_health_check_needs_no_token(auth_server):
    with grpc.insecure_channel(auth_server.address) as channel:
        assert health_status(channel) == health_pb2.HealthCheckResponse.SERVING
        assert health_status(channel, SERVICE_NAME) == health_pb2.HealthCheckResponse.SERVING


# ---------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    return make_certificate(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_server(serve_module, certificate):
    cert, key = certificate
    server = serve_module(tls_cert=cert, tls_key=key)
    yield server


def test_token_travels_over_tls_as_call_credentials(tiny_engine, certificate, tiny_vocab, drafter, prompt, want):
    cert, key = certificate
    config = ServerConfig(host="127.0.0.1", port=0, tls_cert=cert, tls_key=key, auth_token=TOKEN)
    with BackgroundServer(tiny_engine, config) as server:
        address = f"localhost:{server.port}"  # the certificate names localhost
        assert decode(address, tiny_vocab, drafter, prompt, root_certificates=cert, auth_token=TOKEN) == want
        with pytest.raises(VerifierError, match="UNAUTHENTICATED"):
            decode(address, tiny_vocab, drafter, prompt, root_certificates=cert, auth_token="wrong")


def test_tls_link_decodes_exactly(tls_server, certificate, tiny_vocab, drafter, prompt, want):
    address = f"localhost:{tls_server.port}"
    assert decode(address, tiny_vocab, drafter, prompt, root_certificates=certificate[0]) == want


def test_plaintext_link_to_a_tls_server_fails_within_the_connect_timeout(tls_server, tiny_vocab, drafter, prompt):
    started = time.perf_counter()
    with pytest.raises(VerifierError, match="unreachable") as error:
        decode(f"localhost:{tls_server.port}", tiny_vocab, drafter, prompt, connect_timeout_s=3)
    elapsed = time.perf_counter() - started
    assert f"localhost:{tls_server.port}" in str(error.value)
    assert 2.5 < elapsed < 8, f"gave up after {elapsed:.1f}s, the connect timeout is 3s"


def test_tls_link_refuses_a_server_it_does_not_trust(tls_server, tmp_path, tiny_vocab, drafter, prompt):
    stranger, _ = make_certificate(tmp_path / "other")
    started = time.perf_counter()
    with pytest.raises(VerifierError, match="unreachable"):
        decode(f"localhost:{tls_server.port}", tiny_vocab, drafter, prompt, root_certificates=stranger,
               connect_timeout_s=1.5)
    assert time.perf_counter() - started < 6.5


# ---------------------------------------------------------------- command lines


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_edge_cli_reports_an_unreachable_cloud(tiny_models):
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "sim.cli", "edge", "run", "--cloud", f"127.0.0.1:{closed_port()}",
         "--drafter", tiny_models["drafter_f32"], "--prompt", "hi", "--connect-timeout", "2"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )
    elapsed = time.perf_counter() - started
    assert result.returncode != 0
    assert "unreachable" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert elapsed < 12, f"took {elapsed:.1f}s with a 2s connect timeout"


def _lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line)
    into.put(None)


def test_cloud_cli_serves_answers_health_and_stops_on_sigterm(tiny_models):
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim.cli", "cloud", "serve", "--target", tiny_models["target"], "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )
    try:
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_lines, args=(proc.stdout, lines), daemon=True).start()
        try:
            line = lines.get(timeout=90)
        except queue.Empty:
            pytest.fail("cloud serve printed nothing within 90s")
        assert line is not None, proc.stderr.read()
        assert "serving" in line and " on 127.0.0.1:" in line, line
        port = int(line.rsplit(":", 1)[1])
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            assert health_status(channel) == health_pb2.HealthCheckResponse.SERVING
            assert health_status(channel, SERVICE_NAME) == health_pb2.HealthCheckResponse.SERVING
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
        rest = []
        while (item := lines.get(timeout=5)) is not None:
            rest.append(item)
        assert any("stopped" in item for item in rest), rest
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
