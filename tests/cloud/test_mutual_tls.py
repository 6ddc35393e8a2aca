"""Mutual TLS: a verifier with ``--tls-client-ca`` lets in only edges whose certificate its CA signed, and a
stream without a token is the client its certificate names, for every per-client bound.

Real servers on loopback, real ``GrpcVerifier``s and raw streams; certificates made by the openssl
command line.
"""

from __future__ import annotations

import pytest
from helpers import make_certificate, make_client_certificates, opened_in_turn, tiny_drafter, tiny_prompt

from cloud.identity import certificate_identity
from cloud.limits import ServiceLimits
from cloud.server import ServerConfig
from edge.channel import make_channel
from edge.decode_loop import run_decode
from edge.endpoint import VerifierEndpoint
from edge.grpc_verifier import GrpcVerifier
from edge.schedule import SpecConfig
from edge.verifier_protocol import VerifierError
from shared.params import Mode, SamplingParams
from sim.inprocess import generate

GREEDY = SamplingParams(mode=Mode.GREEDY)
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def server_certificate(tmp_path_factory):
    return make_certificate(tmp_path_factory.mktemp("server-tls"))


@pytest.fixture(scope="module")
def clients(tmp_path_factory):
    """(the CA's PEM, {common name: (cert, key)})."""
    return make_client_certificates(tmp_path_factory.mktemp("client-tls"), ["edge-7", "edge-8"])


@pytest.fixture(scope="module")
def mtls_server(serve_module, server_certificate, clients):
    cert, key = server_certificate
    return serve_module(ServiceLimits(max_sessions_per_client=1), tls_cert=cert, tls_key=key,
                        tls_client_ca=clients[0])


@pytest.fixture(scope="module")
def drafter(tiny_models):
    made = tiny_drafter(tiny_models, "drafter_f32")
    yield made
    made.close()


def decode(server, tiny_engine, drafter, root: bytes, client_certificate=None, connect_timeout_s: float = 10.0):
    prompt = tiny_prompt(tiny_engine, "We have 3 dogs and 12 cats!")
    endpoint = VerifierEndpoint(f"localhost:{server.port}", tiny_engine.vocab_size, tiny_engine.fingerprint,
                                root_certificates=root, client_certificate=client_certificate,
                                connect_timeout_s=connect_timeout_s)
    link = GrpcVerifier(endpoint)
    try:
        return prompt, run_decode(drafter, link, prompt, GREEDY, max_new_tokens=NEW_TOKENS, spec=SpecConfig(4)).tokens
    finally:
        link.close()


def test_an_edge_with_a_certificate_the_ca_signed_decodes_exactly(mtls_server, server_certificate, clients,
                                                                 tiny_engine, drafter):
    prompt, got = decode(mtls_server, tiny_engine, drafter, server_certificate[0], clients[1]["edge-7"])
    assert got == generate(tiny_engine, drafter, prompt, GREEDY, max_new_tokens=NEW_TOKENS, spec=SpecConfig(0)).tokens


def test_an_edge_without_a_certificate_or_with_a_stranger_s_is_refused(mtls_server, server_certificate, tiny_engine,
                                                                      drafter, tmp_path):
    with pytest.raises(VerifierError, match="unreachable"):
        decode(mtls_server, tiny_engine, drafter, server_certificate[0], connect_timeout_s=1.5)
    _, strangers = make_client_certificates(tmp_path / "stranger", ["edge-7"])  # same name, another CA
    with pytest.raises(VerifierError, match="unreachable"):
        decode(mtls_server, tiny_engine, drafter, server_certificate[0], strangers["edge-7"], connect_timeout_s=1.5)


def test_the_certificate_s_name_is_the_identity_for_per_client_bounds(mtls_server, server_certificate, clients,
                                                                     tiny_engine):
    """One session per client: a second edge-7 stream is refused, edge-8's is its own client's first."""
    address = f"localhost:{mtls_server.port}"
    pairs = [clients[1]["edge-7"], clients[1]["edge-7"], clients[1]["edge-8"]]
    channels = [make_channel(address, server_certificate[0], client_certificate=pair) for pair in pairs]
    assert opened_in_turn(mtls_server, tiny_engine, [None, None, None], channels=channels) == [
        "opened", "RESOURCE_EXHAUSTED", "opened"]
    owners = sorted(entry.owner for entry in mtls_server.server.servicer.table.entries())
    assert owners == ["client:edge-7", "client:edge-8"]


def test_a_common_name_that_is_no_client_id_is_the_certificate_s_digest():
    assert certificate_identity({"x509_common_name": [b"edge-7"]}) == "client:edge-7"
    odd = certificate_identity({"x509_common_name": [b"a b/c"], "x509_pem_cert": [b"PEM"]})
    assert odd is not None and odd.startswith("cert:") and len(odd) == len("cert:") + 32
    assert certificate_identity({}) is None


def test_client_certificates_need_the_server_s_own_tls_and_make_grants_by_client_possible(server_certificate, clients):
    with pytest.raises(ValueError, match="--tls-client-ca needs --tls-cert"):
        ServerConfig(tls_client_ca=clients[0])
    with pytest.raises(ValueError, match="grants by client need"):
        ServerConfig(limits=ServiceLimits(rejection_to=("edge-7",)))
    cert, key = server_certificate
    config = ServerConfig(limits=ServiceLimits(rejection_to=("edge-7",)), tls_cert=cert, tls_key=key,
                          tls_client_ca=clients[0])
    assert config.tls_client_ca == clients[0]
    with pytest.raises(ValueError, match="--tls-ca"):
        make_channel("localhost:1", client_certificate=clients[1]["edge-7"])
