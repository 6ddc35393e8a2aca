"""The verifier an edge talks to, as one config: where it is, how to reach it, and the vocabulary
the edge claims there.

Both clients take it (``edge.grpc_verifier.GrpcVerifier``, ``edge.cloud_only.cloud_only_generate``);
an entry point builds it once from its flags. It holds no connection.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from edge.channel import make_channel

__all__ = ["VerifierEndpoint"]


@dataclass(frozen=True)
class VerifierEndpoint:
    address: str  # host:port of the verifier, or of a proxy in front of it
    # The drafter's vocabulary: the cloud refuses a session whose size or fingerprint differs from its target's.
    vocab_size: int
    fingerprint: bytes
    root_certificates: bytes | None = None  # PEM CA bundle to trust: TLS (None: plaintext, or local credentials)
    auth_token: str | None = field(default=None, repr=False)  # bearer token for every call (TLS or loopback only)
    # (PEM certificate chain, PEM private key) shown in the TLS handshake, for a verifier with mutual TLS.
    client_certificate: tuple[bytes, bytes] | None = field(default=None, repr=False)
    connect_timeout_s: float = 10.0  # no connection by then: the cloud is unreachable
    # The target weights' fingerprint the session must be served by (``Opened.target_fingerprint``; None: any).
    # A reproducible session that pins the one its baseline recorded cannot be served by a swapped checkpoint.
    pinned_target: bytes | None = None

    def check_target(self, served: bytes) -> None:
        """Raise ``VerifierError`` when a target is pinned and ``served`` is another."""
        if self.pinned_target is not None and served != self.pinned_target:
            from edge.verifier_protocol import VerifierError

            raise VerifierError(
                f"the verifier serves target weights {served.hex() or '(not said: an older verifier)'}, not the "
                f"pinned {self.pinned_target.hex()} (--pin-target): a different checkpoint would not reproduce "
                "the pinned outputs")

    def open_channel(self) -> grpc.Channel:
        """A new channel with this endpoint's credentials (``edge.channel.make_channel``); the caller closes it."""
        return make_channel(self.address, self.root_certificates, self.auth_token, self.client_certificate)
