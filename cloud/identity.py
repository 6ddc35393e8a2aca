"""Who a stream is: the identity behind every per-client bound, share, metric bucket and resume.

With credentials (``--auth-tokens FILE``, one ``client-id token`` per line; or ``--auth-token-file``,
one token for the client ``default``), a stream's identity is the client whose token it presents. The
server's interceptor refuses a stream with no known token (``UNAUTHENTICATED``) before it reaches the
servicer, so every stream the servicer sees has a verified identity. With client certificates
(mutual TLS: ``--tls-client-ca``, the server refusing a handshake without a certificate that CA signed)
and no token for the stream, the identity is the certificate's common name (``client:<CN>``; a name that
is not a client id is the certificate's digest, ``cert:<hex>``); a token, where there are credentials,
names the client over the certificate. Without either the identity is the peer's address (its host, not
the port): never a header the client chose, so made-up tokens cannot multiply a client into many.

A credentials file holds, per line, a client id (letters, digits, ``.``, ``_``, ``-``) and its token, or
``sha256:`` and the hex SHA-256 of the token (so the file need not hold the tokens themselves); ``#``
starts a comment. Tokens are looked up by their SHA-256, so how long a lookup takes says nothing about
how much of a token was right. ``Credentials.reload`` reads the file again (the server calls it on
SIGHUP); a file that does not parse leaves the credentials as they were.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping
from pathlib import Path

__all__ = ["Credentials", "Identities", "certificate_identity", "peer_host", "granted", "DEFAULT_CLIENT", "GRANT_ALL", "GRANT_CLIENTS"]

log = logging.getLogger(__name__)

DEFAULT_CLIENT = "default"  # the client of a single --auth-token-file token
GRANT_ALL = "all"  # a grant to every identity
GRANT_CLIENTS = "clients"  # a grant to every client that presented a token (not to peers)
_CLIENT_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_DIGEST = re.compile(r"sha256:([0-9a-fA-F]{64})")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def peer_host(peer: str) -> str:
    """A gRPC peer's address without its port (``ipv4:1.2.3.4:5678`` -> ``ipv4:1.2.3.4``,
    ``ipv6:[::1]:5678`` -> ``ipv6:[::1]``): one identity per host, whatever port a stream came from."""
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer


def granted(identity: str, grants: tuple[str, ...]) -> bool:
    """Whether ``identity`` (``Identities.of``) holds one of ``grants``: ``GRANT_ALL``, ``GRANT_CLIENTS``
    (any ``client:``), a client id, or an identity written out (``peer:ipv4:10.0.0.7``)."""
    for grant in grants:
        if grant == GRANT_ALL or identity == grant or identity == f"client:{grant}":
            return True
        if grant == GRANT_CLIENTS and identity.startswith("client:"):
            return True
    return False


def parse_credentials(text: str, source: str = "credentials") -> dict[bytes, str]:
    """{SHA-256 of a token: its client id} from a credentials file's ``text``; ``ValueError`` naming the
    line for anything else (a malformed line, a client or a token given twice, no entry at all)."""
    clients: dict[bytes, str] = {}
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not _CLIENT_ID.fullmatch(parts[0]):
            raise ValueError(f"{source}:{number}: expected 'client-id token' (an id of letters, digits, '.', '_', "
                             "'-', then the token or sha256:<hex>)")
        client, secret = parts
        hashed = _DIGEST.fullmatch(secret)
        digest = bytes.fromhex(hashed.group(1)) if hashed else _digest(secret)
        if client in seen:
            raise ValueError(f"{source}:{number}: client {client} is listed twice")
        if digest in clients:
            raise ValueError(f"{source}:{number}: client {client}'s token is also {clients[digest]}'s")
        seen.add(client)
        clients[digest] = client
    if not clients:
        raise ValueError(f"{source} lists no client")
    return clients


class Credentials:
    """Which client each token belongs to."""

    def __init__(self, clients: Mapping[str, str], path: Path | None = None) -> None:
        """``clients``: client id -> token; ``path``: the file they came from, read again by ``reload``."""
        text = "\n".join(f"{client} {token}" for client, token in clients.items())
        self._by_digest = parse_credentials(text)
        self.path = path

    @classmethod
    def from_file(cls, path: Path) -> Credentials:
        credentials = cls.__new__(cls)
        credentials._by_digest = parse_credentials(Path(path).read_text(), str(path))
        credentials.path = Path(path)
        return credentials

    @classmethod
    def single(cls, token: str) -> Credentials:
        """One token, for the client ``DEFAULT_CLIENT`` (``--auth-token-file``): every holder is one client."""
        return cls({DEFAULT_CLIENT: token})

    def __len__(self) -> int:
        return len(self._by_digest)

    def client_of(self, authorization: str) -> str | None:
        """The client whose token an ``authorization: Bearer <token>`` header presents (None: no such one)."""
        if not authorization.startswith("Bearer "):
            return None
        return self._by_digest.get(_digest(authorization.removeprefix("Bearer ")))

    def reload(self) -> bool:
        """Read the file again; a file that does not parse (or is gone) keeps the credentials as they were
        and says why in the log. Returns whether it took the new ones."""
        if self.path is None:
            return False
        try:
            self._by_digest = parse_credentials(self.path.read_text(), str(self.path))
        except (OSError, ValueError) as exc:
            log.error("credentials not reloaded, the %d clients before kept: %s", len(self), exc)
            return False
        log.info("credentials reloaded from %s: %d clients", self.path, len(self))
        return True


class Identities:
    """A stream's identity (``of``): its client's id under ``credentials``, else its client certificate's
    name where the server verifies certificates (``by_certificate``), else its peer's host."""

    def __init__(self, credentials: Credentials | None = None, by_certificate: bool = False) -> None:
        self.credentials = credentials
        self.by_certificate = by_certificate

    def of(self, context) -> str:
        """``client:<id>`` for a stream that presented a client's token (the only kind the interceptor lets
        through where there are credentials), else ``certificate_identity`` of its verified client
        certificate, else ``peer:<host>``."""
        if self.credentials is not None:
            header = str(dict(context.invocation_metadata() or ()).get("authorization", ""))
            client = self.credentials.client_of(header)
            if client is not None:
                return f"client:{client}"
        if self.by_certificate:
            identity = certificate_identity(context.auth_context() or {})
            if identity is not None:
                return identity
        return f"peer:{peer_host(context.peer() or '')}"


def certificate_identity(auth_context: Mapping[str, list[bytes]]) -> str | None:
    """The identity a verified client certificate names, from gRPC's ``auth_context``: ``client:<CN>``
    where its common name is a client id, else ``cert:<hex>`` (the first 16 bytes of the SHA-256 of the
    certificate's PEM); None without a client certificate."""
    names = auth_context.get("x509_common_name") or []
    name = names[0].decode(errors="replace") if names else ""
    if _CLIENT_ID.fullmatch(name):
        return f"client:{name}"
    pems = auth_context.get("x509_pem_cert") or []
    return f"cert:{hashlib.sha256(pems[0]).hexdigest()[:32]}" if pems else None
