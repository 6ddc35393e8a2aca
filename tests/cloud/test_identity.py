"""Identity: every per-client bound counts against a verified client, never a header the client chose.

Without credentials a client is its peer's host, so made-up bearer tokens are one client; with
``--auth-tokens`` each listed client is its own share, an unknown token is refused, and the file is read
again on ``Credentials.reload`` (SIGHUP) without a restart.
"""

from __future__ import annotations

import hashlib
import time

import pytest
from helpers import HeldSession, opened_in_turn

from cloud.identity import Credentials, parse_credentials, peer_host
from cloud.limits import ServiceLimits


def test_made_up_tokens_are_one_client_without_credentials(tiny_engine, serve):
    """With no credentials the peer's host is the client: three made-up tokens do not make three clients."""
    server = serve(ServiceLimits(max_sessions_per_client=2))
    assert opened_in_turn(server, tiny_engine, ["made-up-1", "made-up-2", "made-up-3"]) == [
        "opened", "opened", "RESOURCE_EXHAUSTED"]


def test_each_listed_client_has_its_own_share_and_an_unknown_token_is_refused(tiny_engine, serve):
    credentials = Credentials({"alice": "a-token-0123456789", "bob": "b-token-0123456789"})
    server = serve(ServiceLimits(max_sessions_per_client=1), credentials=credentials)
    assert opened_in_turn(server, tiny_engine, ["a-token-0123456789", "b-token-0123456789", "a-token-0123456789"]) == [
        "opened", "opened", "RESOURCE_EXHAUSTED"]
    assert opened_in_turn(server, tiny_engine, ["c-token-0123456789", None]) == ["UNAUTHENTICATED", "UNAUTHENTICATED"]
    owners = sorted(entry.owner for entry in server.server.servicer.table.entries())  # (parked now)
    assert owners == ["client:alice", "client:bob"]


def test_credentials_are_read_again_on_reload_and_a_bad_file_keeps_the_old(tiny_engine, serve, tmp_path):
    path = tmp_path / "clients"
    path.write_text("alice a-token-0123456789\n")
    credentials = Credentials.from_file(path)
    server = serve(ServiceLimits(), credentials=credentials)
    assert opened_in_turn(server, tiny_engine, ["b-token-0123456789"]) == ["UNAUTHENTICATED"]
    digest = hashlib.sha256(b"b-token-0123456789").hexdigest()
    path.write_text(f"# clients\nalice a-token-0123456789\nbob sha256:{digest}  # hashed\n")
    assert credentials.reload()
    assert opened_in_turn(server, tiny_engine, ["b-token-0123456789"]) == ["opened"]
    path.write_text("alice\n")  # malformed: the clients before are kept
    assert not credentials.reload() and len(credentials) == 2
    assert opened_in_turn(server, tiny_engine, ["a-token-0123456789"]) == ["opened"]


@pytest.mark.parametrize(("text", "error"), [
    ("alice", "clients:1: expected 'client-id token'"),
    ("alice t1\nbob t2 extra", "clients:2: expected"),
    ("al ice t1", "clients:1: expected"),
    ("alice t1\nalice t2", "clients:2: client alice is listed twice"),
    ("alice t1\nbob t1", "clients:2: client bob's token is also alice's"),
    ("# nobody\n", "clients lists no client"),
])
def test_a_credentials_file_that_does_not_parse_names_its_line(text, error):
    with pytest.raises(ValueError, match=error):
        parse_credentials(text, "clients")


def test_a_peer_is_its_host_whatever_its_port():
    assert peer_host("ipv4:127.0.0.1:5555") == peer_host("ipv4:127.0.0.1:6666") == "ipv4:127.0.0.1"
    assert peer_host("ipv6:[::1]:5555") == "ipv6:[::1]"


def test_streams_past_the_limit_per_client_are_refused_before_their_open(tiny_engine, serve):
    """Streams count from their first byte: a client cannot hold the verifier with streams that never
    send an Open (each waits ``open_timeout_s``), nor keep more streams than its limit beside its sessions."""
    server = serve(ServiceLimits(max_streams_per_client=2))
    silent = [HeldSession(server.address, tiny_engine, None, send_open=False) for _ in range(2)]
    try:
        counted = server.server.servicer.streams
        deadline = time.monotonic() + 10
        while counted.held("peer:ipv4:127.0.0.1") < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        refused = HeldSession(server.address, tiny_engine, None)
        assert refused.first() == "RESOURCE_EXHAUSTED"
        refused.close()
        silent.pop().close()  # one ends: room for another
        deadline = time.monotonic() + 10
        while counted.held("peer:ipv4:127.0.0.1") > 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert opened_in_turn(server, tiny_engine, [None]) == ["opened"]
    finally:
        for session in silent:
            session.close()
