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
    connect_timeout_s: float = 10.0  # no connection by then: the cloud is unreachable

    def open_channel(self) -> grpc.Channel:
        """A new channel with this endpoint's credentials (``edge.channel.make_channel``); the caller closes it."""
        return make_channel(self.address, self.root_certificates, self.auth_token)
