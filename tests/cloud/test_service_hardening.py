"""The verifier against careless and hostile clients: corrupt frames, silent streams, a client
filling the table, taken ports, bad flags. Real servers on loopback; the CLIs as subprocesses."""

from __future__ import annotations

import http.client
import logging
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from helpers import make_certificate, tiny_prompt

from cloud.limits import ServiceLimits
from cloud.server import BackgroundServer, ServerConfig
from cloud.session_table import SessionTable, TableFull
from protos import splitspec_pb2 as pb
from protos import splitspec_pb2_grpc as pb_grpc
from shared import codec
from shared.params import Mode, SamplingParams
from shared.wire import sampling_to_proto

GREEDY = SamplingParams(mode=Mode.GREEDY)
DECODE = "/splitspec.v1.Verifier/Decode"
GENERATE = "/splitspec.v1.Verifier/Generate"


def open_bytes(engine, prompt, max_new_tokens=8) -> bytes:
    encoded = codec.encode_tokens(prompt, engine.vocab_size)
    frame = pb.EdgeFrame(open=pb.Open(vocab_size=engine.vocab_size, vocab_fingerprint=engine.fingerprint,
                                      sampling=sampling_to_proto(GREEDY), prompt=encoded.data,
                                      max_new_tokens=max_new_tokens))
    return frame.SerializeToString()


def raw_call(address: str, frames: list[bytes], timeout: float = 10):
    """Send raw (possibly corrupt) frames on a Decode stream: (reply kinds, status code, details)."""
    with grpc.insecure_channel(address) as channel:
        decode = channel.stream_stream(DECODE, request_serializer=lambda b: b,
                                       response_deserializer=pb.CloudFrame.FromString)
        kinds = []
        try:
            for reply in decode(iter(frames), timeout=timeout):
                kinds.append(reply.WhichOneof("kind"))
        except grpc.RpcError as error:
            return kinds, error.code(), error.details()
    return kinds, grpc.StatusCode.OK, ""


def table_empties(server, within_s: float) -> bool:
    table = server.server.servicer.table
    deadline = time.monotonic() + within_s
    while len(table) and time.monotonic() < deadline:
        time.sleep(0.02)
    return len(table) == 0


@pytest.fixture()
def server(serve):
    limits = ServiceLimits(max_sessions=4, idle_timeout_s=1.0, session_ttl_s=30)
    made = serve(limits)
    yield made


# ---------------------------------------------------------------- corrupt frames


def test_a_corrupt_frame_ends_its_stream_with_invalid_argument_and_frees_the_session(tiny_engine, server, caplog):
    prompt = tiny_prompt(tiny_engine, "The cat")
    caplog.set_level(logging.INFO)
    kinds, code, details = raw_call(server.address, [open_bytes(tiny_engine, prompt), b"\xff\xff\xff\x01garbage"])
    assert kinds == ["opened"] and code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert "malformed frame" in details
    assert table_empties(server, within_s=1.0)  # freed with the stream, not after the 30 s TTL
    assert "Traceback" not in caplog.text


@pytest.mark.parametrize("request_bytes", [b"\xff\xff\xff\x01garbage", b"\x12"])  # not protobuf; cut short
def test_a_malformed_generate_request_gets_invalid_argument_and_one_line(server, caplog, request_bytes):
    caplog.set_level(logging.INFO)
    with grpc.insecure_channel(server.address) as channel:
        generate = channel.unary_stream(GENERATE, request_serializer=lambda b: b,
                                        response_deserializer=pb.GenerateChunk.FromString)
        with pytest.raises(grpc.RpcError) as error:
            list(generate(request_bytes, timeout=10))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value
    assert "malformed request" in error.value.details()
    ended = [r.getMessage() for r in caplog.records if " ended: " in r.getMessage()]
    assert len(ended) == 1 and "INVALID_ARGUMENT: malformed request" in ended[0], ended
    assert "Traceback" not in caplog.text and "Unexpected" not in caplog.text, caplog.text
    assert table_empties(server, within_s=1.0)


def test_a_flood_of_bad_streams_logs_a_bounded_number_of_lines(tiny_engine, server, caplog):
    prompt = tiny_prompt(tiny_engine, "The cat")
    caplog.set_level(logging.INFO, logger="cloud.servicer")
    bad = [open_bytes(tiny_engine, prompt), b"\xff\xff"]
    started = time.monotonic()
    for _ in range(60):
        raw_call(server.address, bad)
    seconds = time.monotonic() - started
    ended = [r.getMessage() for r in caplog.records if " ended: " in r.getMessage()]
    assert len(ended) <= 20 * (int(seconds) + 1), (len(ended), seconds)  # at most 20 lines a second
    time.sleep(1.1)
    raw_call(server.address, bad)  # the next line says how many were left out
    lines = [r.getMessage() for r in caplog.records if " ended: " in r.getMessage()]
    left_out = [int(m) for line in lines for m in re.findall(r"\((\d+) more not logged\)", line)]
    assert len(lines) + sum(left_out) == 61, lines  # every stream is on a line or counted on a later one
    assert table_empties(server, within_s=1.0)


# ---------------------------------------------------------------- the table


def test_silent_streams_cannot_lock_honest_clients_out(tiny_engine, server):
    """Fill every slot with streams that open and go silent; an honest session gets in within about
    the idle timeout, because idle streams are parked and a full table evicts parked sessions."""
    prompt = tiny_prompt(tiny_engine, "The cat")
    frames: list = []
    calls = []
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.VerifierStub(channel)
        for _ in range(4):
            queue_ = __import__("queue").Queue()
            queue_.put(pb.EdgeFrame.FromString(open_bytes(tiny_engine, prompt)))
            frames.append(queue_)
            call = stub.Decode(iter(queue_.get, None), timeout=30)
            assert next(call).WhichOneof("kind") == "opened"
            calls.append(call)
        started = time.monotonic()
        while True:
            kinds, code, details = raw_call(server.address, [open_bytes(tiny_engine, prompt),
                                                             pb.EdgeFrame(close=pb.Close()).SerializeToString()])
            if code == grpc.StatusCode.OK:
                break
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
            assert time.monotonic() - started < 5, "locked out for more than 5 s"
            time.sleep(0.1)
        lockout = time.monotonic() - started
        for queue_ in frames:
            queue_.put(None)
        for call in calls:
            call.cancel()
    assert kinds == ["opened"] and lockout < 4.5, lockout  # the 1 s idle timeout, and a loaded machine's slack


def test_the_kv_budget_evicts_parked_sessions_then_refuses_and_a_turn_can_grow_within_it():
    table = SessionTable(max_sessions=10, ttl_s=60, max_tokens=100)
    first = table.add("s", "alice", 60)
    with pytest.raises(TableFull, match="KV cache budget is full"):
        table.add("s", "bob", 50)
    table.detach(first)  # parked: its reservation can be taken back
    second = table.add("s", "bob", 50)
    assert table.resume(first.ticket) is None and table.reserved_tokens == 50
    table.resize(second, 100)  # the conversation's next turn fits exactly
    with pytest.raises(TableFull, match="exceeds the verifier's budget of 100"):
        table.resize(second, 101)
    assert second.tokens == 100
    table.remove(second)
    assert table.reserved_tokens == 0


def test_each_client_reserves_kv_bytes_within_its_share_and_others_are_not_touched():
    """One client's sessions reserve at most its share of KV bytes (positions at what one costs), its own
    parked sessions make room, another client is not touched, and a turn cannot grow past the share."""
    table = SessionTable(max_sessions=10, ttl_s=60, kv_share=(1000, 100_000))  # 100 positions each client
    first = table.add("s", "client:alice", 60)
    bob = table.add("s", "client:bob", 90)
    with pytest.raises(TableFull, match="its share is 0.1 MiB"):
        table.add("s", "client:alice", 50)
    with pytest.raises(TableFull, match="over this client's share"):
        table.add("s", "client:carol", 101)
    table.detach(first)  # her own parked session makes room; bob's is not touched
    second = table.add("s", "client:alice", 50)
    assert table.resume(first.ticket) is None and table.resume(bob.ticket) is bob
    table.resize(second, 100)
    with pytest.raises(TableFull, match="over this client's share"):
        table.resize(second, 101)


def test_the_service_sizes_the_share_by_what_a_position_costs(tiny_engine, serve):
    server = serve(ServiceLimits(max_kv_mib_per_client=1))
    table = server.server.servicer.table
    assert table.kv_bytes_per_position == tiny_engine.kv_bytes_per_position > 0
    assert table.max_kv_bytes_per_owner == 2**20


def test_the_table_evicts_parked_sessions_and_caps_each_client():
    now = [0.0]
    table = SessionTable(max_sessions=3, ttl_s=60, clock=lambda: now[0], max_per_owner=2)
    a1, a2 = table.add("s", "alice"), table.add("s", "alice")
    with pytest.raises(TableFull, match="limit per client"):
        table.add("s", "alice")
    table.detach(a1)  # alice's parked session makes room for her next one
    a3 = table.add("s", "alice")
    assert table.resume(a1.ticket) is None and table.evicted == 1
    b1 = table.add("s", "bob")
    now[0] = 1.0
    table.touch(a3)
    # Every slot attached, alice holds two: carol takes the one of hers used least lately (slots max-min).
    c1 = table.add("s", "carol")
    assert a2.preempted and not a3.preempted and table.preempted == 1 and table.resume(a2.ticket) is None
    with pytest.raises(TableFull, match="limit of 3 sessions"):
        table.add("s", "dave")  # one each, every one attached: refuse
    now[0] = 5.0
    table.detach(a3)
    now[0] = 6.0
    table.detach(b1)
    d1 = table.add("s", "dave")  # evicts the longest-parked (alice's a3)
    assert table.resume(a3.ticket) is None and table.resume(b1.ticket, "bob") is b1
    assert table.resume(c1.ticket, "mallory") is None  # a ticket only serves its owner
    assert {b1.owner, c1.owner, d1.owner} == {"bob", "carol", "dave"} and len(table) == 3


# ---------------------------------------------------------------- ports and flags


def _run(*args, timeout=120):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)


def one_line_error(result, code: int) -> None:
    assert result.returncode == code, (result.returncode, result.stderr[-2000:])
    lines = [line for line in result.stderr.strip().splitlines() if "error" in line]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]


def test_a_taken_port_is_refused(tiny_engine, tiny_models, server):
    with pytest.raises(OSError, match="in use"):
        BackgroundServer(tiny_engine, ServerConfig(port=server.port)).start()
    one_line_error(_run("-m", "cloud.cli", "serve", "--target", tiny_models["target"], "--port", str(server.port)), 1)
    with socket.socket() as plain:  # a port held by something that is not gRPC
        plain.bind(("127.0.0.1", 0))
        plain.listen()
        one_line_error(_run("-m", "cloud.cli", "serve", "--target", tiny_models["target"],
                            "--port", str(plain.getsockname()[1])), 1)


@pytest.mark.parametrize(
    "flags, phrase",
    [
        (["--port", "70000"], "must be a port"),
        (["--port", "-1"], "must be a port"),
        (["--device", "bogus"], "not a torch device"),
        (["--device", "cuda"], "no CUDA device"),
        (["--idle-timeout", "0"], "must be a finite number > 0"),
        (["--metrics-port", "0", "--metrics-host", "0.0.0.0"], "refusing to serve metrics in cleartext on 0.0.0.0"),
    ],
)
def test_bad_cloud_flags_end_with_one_line_and_exit_2(tiny_models, flags, phrase):
    if flags == ["--device", "cuda"]:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
    result = _run("-m", "cloud.cli", "serve", "--target", tiny_models["target"], "--port", "0", *flags)
    one_line_error(result, 2)
    assert phrase in result.stderr


def test_canonical_shapes_without_an_invariant_row_tile_are_refused(tiny_models, monkeypatch):
    """A device whose products no row padding makes batch-invariant (faked: the load-time check finds
    none): ``--shapes canonical`` refuses to start, saying why; auto starts and refuses reproducible sessions."""
    import cloud.engine

    fake = "import sys, cloud.engine as e; e.invariant_row_padding = lambda *a, **k: None; from cloud.cli import main; "
    result = _run("-c", fake + "sys.exit(main(sys.argv[1:]))", "serve", "--target", tiny_models["target"],
                  "--port", "0", "--shapes", "canonical")
    one_line_error(result, 2)
    assert "canonical shapes refused" in result.stderr and "not row-invariant" in result.stderr, result.stderr
    monkeypatch.setattr(cloud.engine, "invariant_row_padding", lambda *args, **kwargs: None)
    auto = cloud.engine.TargetEngine(tiny_models["target"], shapes="auto")
    assert not auto.invariant and not auto.serves_reproducible


def test_metrics_stay_on_loopback_and_leave_it_only_over_the_service_s_tls(tiny_engine, tmp_path):
    with pytest.raises(ValueError, match="refusing to serve metrics in cleartext on 0.0.0.0.*--insecure"):
        ServerConfig(host="0.0.0.0", metrics_port=0, metrics_host="0.0.0.0")
    assert ServerConfig(metrics_port=0, metrics_host="0.0.0.0", insecure=True).metrics_host == "0.0.0.0"
    assert ServerConfig(host="0.0.0.0", metrics_port=0).metrics_host == "127.0.0.1"  # not --host's
    with BackgroundServer(tiny_engine, ServerConfig(port=0, metrics_port=0)) as plain:
        url = f"http://127.0.0.1:{plain.server.metrics_port}/metrics"
        assert "splitspec_sessions_opened" in urllib.request.urlopen(url, timeout=10).read().decode()
    cert, key = make_certificate(tmp_path)
    with BackgroundServer(tiny_engine, ServerConfig(port=0, metrics_port=0, tls_cert=cert, tls_key=key)) as tls:
        port = tls.server.metrics_port
        trusted = ssl.create_default_context(cadata=cert.decode())
        body = urllib.request.urlopen(f"https://localhost:{port}/metrics", timeout=10, context=trusted).read()
        assert "splitspec_sessions_opened" in body.decode()
        with pytest.raises((OSError, http.client.HTTPException)):  # no cleartext beside it
            urllib.request.urlopen(f"http://localhost:{port}/metrics", timeout=10).read()
    assert not list(Path(tempfile.gettempdir()).glob("splitspec-metrics-tls-*"))  # the key's copy is gone


def test_tls_files_that_are_not_pem_and_a_truncated_model_are_one_line_errors(tiny_models, tmp_path):
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    result = _run("-m", "cloud.cli", "serve", "--target", tiny_models["target"], "--port", "0",
                  "--tls-cert", str(junk), "--tls-key", str(junk))
    one_line_error(result, 2)
    assert "not a PEM file" in result.stderr
    broken = tmp_path / "target"
    broken.mkdir()
    for item in Path(tiny_models["target"]).iterdir():
        data = item.read_bytes()
        (broken / item.name).write_bytes(data[: len(data) // 2] if item.suffix == ".safetensors" else data)
    result = _run("-m", "cloud.cli", "serve", "--target", str(broken), "--port", "0")
    one_line_error(result, 1)
    assert "cannot load the target model" in result.stderr


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.1:99999", "127.0.0.1:abc", ":50051"])
def test_bad_cloud_addresses_are_refused_at_once(tiny_models, address):
    started = time.monotonic()
    result = _run("-m", "edge.cli", "run", "--cloud", address, "--drafter", tiny_models["drafter_f32"],
                  "--prompt", "hi", timeout=60)
    one_line_error(result, 2)
    assert "--cloud" in result.stderr and time.monotonic() - started < 10


@pytest.mark.parametrize(
    "extra, phrase",
    [
        (["--prompt", ""], "prompt must hold at least one token"),
        (["--prompt", "The cat", "--drafter-ctx", "1"], "does not fit the drafter context of 1"),
        (["--prompt", "the cat sat on the mat " * 20, "--drafter-ctx", "64"], "does not fit the drafter context of 64"),
    ],
)
def test_prompts_the_drafter_cannot_take_end_edge_run_with_one_line_and_exit_2(tiny_models, verifier, extra, phrase):
    result = _run("-m", "edge.cli", "run", "--cloud", verifier.address, "--drafter", tiny_models["drafter_f32"], *extra)
    one_line_error(result, 2)
    assert phrase in result.stderr and "drafting the early block failed" not in result.stderr


def test_the_same_bad_input_gets_the_same_exit_code_from_edge_run_and_generate(tiny_models, verifier):
    """A prompt plus max new tokens beyond the target's context: the cloud refuses (exit 2), as generate does."""
    common = ["--drafter", tiny_models["drafter_f32"], "--prompt", "The cat", "--max-new-tokens", "3000"]
    edge = _run("-m", "edge.cli", "run", "--cloud", verifier.address, *common)
    one_line_error(edge, 2)
    assert "exceeds the target's context of 2048" in edge.stderr
    generate = _run("-m", "sim.cli", "generate", "--target", tiny_models["target"], *common)
    one_line_error(generate, 2)
    assert "exceeds the target's context of 2048" in generate.stderr


@pytest.mark.parametrize("temperature, ok", [(1e-310, True), (1e-5, False), (float("nan"), False)])
def test_tiny_or_invalid_temperatures(temperature, ok):
    if ok:
        assert SamplingParams(temperature=temperature).is_greedy  # below float32's range: 0, greedy
    else:
        with pytest.raises(ValueError, match="temperature"):
            SamplingParams(temperature=temperature)
