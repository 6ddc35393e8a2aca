"""The wire schema: generated code matches the .proto, and every frame round-trips."""

from __future__ import annotations

import grpc
import pytest

from protos import generate
from protos import splitspec_pb2 as pb
from protos import splitspec_pb2_grpc as pb_grpc


def test_committed_code_matches_proto():
    # Same code path as `python -m protos.generate --check`.
    assert generate.drifted() == [], "run `python -m protos.generate`"
    assert generate.main(["--check"]) == 0


def test_generation_is_reproducible(tmp_path):
    first = generate.generate(tmp_path / "a")
    second = generate.generate(tmp_path / "b")
    assert [p.name for p in first] == list(generate.GENERATED)
    for a, b in zip(first, second):
        assert a.read_bytes() == b.read_bytes()


def test_check_reports_drift(tmp_path):
    generate.generate(tmp_path)
    stale = tmp_path / "splitspec_pb2.py"
    stale.write_text(stale.read_text() + "# hand edit\n")
    (tmp_path / "splitspec_pb2_grpc.py").unlink()
    assert generate.drifted(tmp_path) == ["splitspec_pb2.py", "splitspec_pb2_grpc.py"]


def test_grpc_module_imports_the_package():
    text = (generate.PROTO_DIR / "splitspec_pb2_grpc.py").read_text()
    assert "from protos import splitspec_pb2 as splitspec__pb2" in text
    assert "\nimport splitspec_pb2" not in text
    assert pb_grpc.splitspec__pb2 is pb


def test_service_shape():
    service = pb.DESCRIPTOR.services_by_name["Verifier"]
    decode, gen = service.methods_by_name["Decode"], service.methods_by_name["Generate"]
    assert decode.client_streaming and decode.server_streaming
    assert not gen.client_streaming and gen.server_streaming
    assert decode.input_type.full_name == "splitspec.v1.EdgeFrame"
    assert gen.output_type.full_name == "splitspec.v1.GenerateChunk"
    stub = pb_grpc.VerifierStub(grpc.insecure_channel("localhost:1"))
    assert callable(stub.Decode) and callable(stub.Generate)
    assert hasattr(pb_grpc, "add_VerifierServicer_to_server")


def _roundtrip(message):
    again = type(message).FromString(message.SerializeToString())
    assert again == message
    return again


def _sampling():
    return pb.Sampling(
        mode=pb.MODE_REJECTION,
        temperature=0.7,
        top_k=40,
        top_p=0.95,
        seed=2**63 + 5,
        draft_top_k=16,
        prob_bits=8,
    )


def test_edge_frames_roundtrip():
    open_ = pb.EdgeFrame(
        open=pb.Open(
            vocab_fingerprint=b"\x01" * 32,
            vocab_size=262144,
            sampling=_sampling(),
            prompt=b"\x00\xff",
            prompt_compressed=True,
            max_new_tokens=256,
            max_draft_len=8,
            resume_ticket=b"ticket",
            committed_length=1234,
        )
    )
    assert _roundtrip(open_).WhichOneof("kind") == "open"
    assert _roundtrip(open_).open.sampling.seed == 2**63 + 5
    draft = pb.EdgeFrame(
        draft=pb.Draft(
            epoch=3, start_position=300, payload=b"x" * 18, compressed=False, more_follows=True
        )
    )
    assert _roundtrip(draft).WhichOneof("kind") == "draft"
    close = pb.EdgeFrame(close=pb.Close())
    assert _roundtrip(close).WhichOneof("kind") == "close"
    assert pb.EdgeFrame().WhichOneof("kind") is None


def test_cloud_frames_roundtrip():
    opened = pb.CloudFrame(
        opened=pb.Opened(
            resume_ticket=b"t",
            vocab_size=300,
            committed_length=17,
            max_draft_len=8,
        )
    )
    assert _roundtrip(opened).WhichOneof("kind") == "opened"
    with_token = pb.CloudFrame(
        verdict=pb.Verdict(epoch=1, start_position=17, accepted=3, token=0, bonus=False)
    )
    again = _roundtrip(with_token)
    assert again.verdict.HasField("token") and again.verdict.token == 0  # explicit presence
    done = pb.CloudFrame(
        verdict=pb.Verdict(
            epoch=1, start_position=21, accepted=2, done=True, stop_reason=pb.STOP_REASON_EOS
        )
    )
    again = _roundtrip(done)
    assert not again.verdict.HasField("token")
    assert again.verdict.stop_reason == pb.STOP_REASON_EOS


def test_generate_messages_roundtrip():
    request = pb.GenerateRequest(
        vocab_fingerprint=b"f",
        vocab_size=300,
        sampling=_sampling(),
        prompt=b"\x01",
        prompt_compressed=False,
        max_new_tokens=64,
    )
    _roundtrip(request)
    chunk = pb.GenerateChunk(
        tokens=b"\x01\x02", compressed=True, done=True, stop_reason=pb.STOP_REASON_LENGTH
    )
    _roundtrip(chunk)


def test_sampling_holds_the_number_the_wire_carries():
    """temperature and top_p cross the wire as float32: every side must compute p with the same value."""
    import numpy as np

    from shared.params import Mode, SamplingParams
    from shared.wire import sampling_from_proto, sampling_to_proto

    rng = np.random.default_rng(7)
    for _ in range(200):
        params = SamplingParams(
            mode=Mode.COUPLED, temperature=float(rng.uniform(0.01, 2.0)), top_p=float(rng.uniform(0.05, 1.0)),
            top_k=int(rng.integers(0, 100)), seed=int(rng.integers(0, 2**63)),
        )
        message = pb.Sampling()
        message.ParseFromString(sampling_to_proto(params).SerializeToString())
        assert sampling_from_proto(message) == params  # bit-for-bit equal floats
    assert SamplingParams(temperature=0.7).temperature == float(np.float32(0.7)) != 0.7


@pytest.mark.parametrize("top_p", [-0.5, float("nan"), 1.5])
def test_out_of_range_top_p_on_the_wire_is_refused(top_p):
    from shared.wire import sampling_from_proto

    with pytest.raises(ValueError, match="top_p"):
        sampling_from_proto(pb.Sampling(mode=pb.MODE_COUPLED, temperature=0.7, top_p=top_p))

