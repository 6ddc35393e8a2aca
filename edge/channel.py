"""Channels to the verifier, and what their errors mean.

A bearer token travels as call credentials, only over TLS or to a loopback
address: a token bound for a remote address in cleartext is refused. A link
that broke is tried again with exponential backoff and jitter within an outage
budget (``retry_while_lost``), gRPC's own reconnect backoff pacing the channel
underneath. Knows nothing of sessions or streams.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import TypeVar

import grpc
from tenacity import Retrying, before_sleep_log, retry_if_exception_type, stop_after_delay, wait_exponential_jitter

from edge.verifier_protocol import LinkLost, VerifierError
from shared.wire import CHANNEL_OPTIONS, is_loopback

__all__ = ["make_channel", "wait_ready", "describe_rpc_error", "retry_while_lost", "BAD_INPUT_CODES"]

log = logging.getLogger(__name__)
T = TypeVar("T")

# Statuses that blame the request, not the link: retrying the same request cannot help.
BAD_INPUT_CODES = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.OUT_OF_RANGE}


def make_channel(address: str, root_certificates: bytes | None = None, auth_token: str | None = None,
                 client_certificate: tuple[bytes, bytes] | None = None) -> grpc.Channel:
    """A channel to the verifier; with ``auth_token``, every call carries it as a bearer token.

    gRPC sends call credentials only over a secure channel: TLS when
    ``root_certificates`` is given, else local credentials, which hold only for
    a loopback address. A token for a remote address without TLS is refused
    (``ValueError``) rather than sent in cleartext. ``client_certificate``
    (PEM certificate chain, PEM private key): presented in the TLS handshake, for
    a verifier that requires one (mutual TLS); it needs ``root_certificates``.
    """
    if client_certificate is not None and root_certificates is None:
        raise ValueError("a client certificate is presented over TLS: give the verifier's CA (--tls-ca) as well")
    if root_certificates is not None:
        chain, key = client_certificate or (None, None)
        credentials = grpc.ssl_channel_credentials(root_certificates, private_key=key, certificate_chain=chain)
    elif auth_token:
        if not is_loopback(address):
            raise ValueError(
                f"refusing to send the bearer token in cleartext to {address}: connect with TLS (--tls-ca) "
                "or to a loopback address"
            )
        credentials = grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP)
    else:
        return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    if auth_token:
        credentials = grpc.composite_channel_credentials(credentials, grpc.access_token_call_credentials(auth_token))
    return grpc.secure_channel(address, credentials, options=CHANNEL_OPTIONS)


# Channels that were connected once. A later connect on one (``edge serve``'s kept channel) does not
# wait again: a wait subscribes to the channel's connectivity, and a second subscription while
# gRPC's poller thread lives (0.2 s after the last) leaves it a connect attempt to make, which,
# after a close, fails in that thread ("Channel closed!"). The calls on a channel that lost its
# connection since fail and end as a lost link does.
_CONNECTED_CHANNELS: weakref.WeakSet = weakref.WeakSet()


def wait_ready(channel: grpc.Channel, address: str, timeout_s: float) -> None:
    """Return once ``channel`` has connected (at once for one connected before); otherwise close
    it and raise ``VerifierError`` after ``timeout_s``."""
    if channel in _CONNECTED_CHANNELS:
        return
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout_s)
    except grpc.FutureTimeoutError as exc:
        channel.close()
        raise VerifierError(f"cloud unreachable at {address} (no connection within {timeout_s:.0f}s)") from exc
    _CONNECTED_CHANNELS.add(channel)


def describe_rpc_error(error: grpc.RpcError) -> str:
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else str(error)
    return f"{code.name if code else 'ERROR'}: {details}"


def retry_while_lost(attempt: Callable[[], T], budget_s: float, what: str) -> tuple[T, int]:
    """``attempt()`` again while it raises ``LinkLost``, spaced by exponential backoff with jitter, for at
    most ``budget_s``: (its result, attempts made). Past the budget, ``VerifierError`` saying ``what``
    could not be done and why."""
    attempts = 0
    retrying = Retrying(stop=stop_after_delay(budget_s), wait=wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.05),
                        retry=retry_if_exception_type(LinkLost), before_sleep=before_sleep_log(log, logging.WARNING),
                        reraise=True)
    try:
        for trial in retrying:
            with trial:
                attempts += 1
                result = attempt()
    except LinkLost as exc:
        raise VerifierError(f"{what} within the outage budget of {budget_s:g}s ({attempts} attempts): {exc}") from exc
    return result, attempts
