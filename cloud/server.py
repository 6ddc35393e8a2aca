"""The verifier's gRPC server: servicer, health, reflection, auth, TLS, metrics, shutdown.

``VerifierServer`` runs on the caller's event loop; ``BackgroundServer`` runs
one on its own thread for synchronous callers (tests, benchmarks).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from cloud.engine import TargetEngine
from cloud.identity import GRANT_ALL, Credentials, Identities
from cloud.limits import ServiceLimits
from cloud.metrics import ServiceMetrics
from cloud.refusals import SlowRefusals
from cloud.servicer import VerifierServicer
from cloud.stream_end import ParseRequests
from protos import splitspec_pb2 as pb
from protos import splitspec_pb2_grpc as pb_grpc
from shared.loop_thread import LoopThread
from shared.wire import SERVER_OPTIONS, is_loopback

__all__ = ["ServerConfig", "VerifierServer", "BackgroundServer", "SERVICE_NAME"]

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Verifier"].full_name


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 50051  # 0 picks a free port
    limits: ServiceLimits = ServiceLimits()
    auth_token: str | None = None  # one bearer token required on Verifier calls (its holders: one client)
    credentials: Credentials | None = None  # or a token per client (--auth-tokens): the client is the identity
    tls_cert: bytes | None = None  # PEM
    tls_key: bytes | None = None  # PEM
    # PEM CA bundle: mutual TLS, a handshake without a client certificate it signed is refused, and a stream
    # without a token is the client its certificate names (``cloud.identity.certificate_identity``).
    tls_client_ca: bytes | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"  # Prometheus listens here; off loopback only over the service's TLS (or insecure)
    grace_s: float = 10.0  # in-flight verdicts get this long on shutdown
    insecure: bool = False  # accept a bearer token, or serve metrics, in cleartext on a non-loopback address
    replica: str = ""  # this replica's name in Opened and on MQTT (default: host-port)
    mqtt_url: str | None = None  # publish status and load to this broker
    batching: bool = True  # pack sessions' forwards together (False: one forward at a time, for comparison)

    def __post_init__(self) -> None:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key: client certificates are checked in the "
                             "TLS handshake")
        for pem, flag in ((self.tls_cert, "--tls-cert"), (self.tls_key, "--tls-key"),
                          (self.tls_client_ca, "--tls-client-ca")):
            if pem is not None and b"-----BEGIN " not in pem:
                raise ValueError(f"{flag} is not a PEM file (no '-----BEGIN' line)")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.auth_token and self.credentials is not None:
            raise ValueError("--auth-token-file and --auth-tokens are alternatives: give one")
        by_client = [g for g in self.limits.rejection_to if g != GRANT_ALL and not g.startswith("peer:")]
        if by_client and self.verified_by() is None and not self.tls_client_ca:
            raise ValueError(f"rejection mode granted to {', '.join(by_client)}: grants by client need bearer tokens "
                             "(--auth-tokens or --auth-token-file) or client certificates (--tls-client-ca); without "
                             "them a client is its peer address "
                             "(grant 'peer:ipv4:HOST', or 'all')")
        if self.verified_by() is not None and not self.tls_cert and not self.insecure and not is_loopback(self.host):
            raise ValueError(
                f"refusing to take a bearer token in cleartext on {self.host}: give --tls-cert and --tls-key, "
                "listen on a loopback address, or pass --insecure (anyone on the path can read the token)"
            )
        if self.metrics_port is not None and not self.tls_cert and not self.insecure and not is_loopback(self.metrics_host):
            raise ValueError(
                f"refusing to serve metrics in cleartext on {self.metrics_host}: give --tls-cert and --tls-key "
                "(the metrics are then served over HTTPS with them), keep --metrics-host on a loopback address, "
                "or pass --insecure (anyone who reaches the port can read the service's load)"
            )

    def verified_by(self) -> Credentials | None:
        """The credentials streams must present (``cloud.identity``): a token per client, the one token's
        single client, or None (no authentication: a stream is its peer's address)."""
        if self.credentials is not None:
            return self.credentials
        return None if self.auth_token is None else Credentials.single(self.auth_token)


class _BearerAuth(grpc.aio.ServerInterceptor):
    """Refuses Verifier calls without ``authorization: Bearer <token>`` of a known client (slowly:
    ``cloud.refusals``); health and reflection stay open."""

    def __init__(self, credentials: Credentials, refusals: SlowRefusals) -> None:
        self._credentials = credentials
        self._refusals = refusals

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or not details.method.startswith(f"/{SERVICE_NAME}/"):
            return handler
        metadata = dict(details.invocation_metadata or ())
        if self._credentials.client_of(str(metadata.get("authorization", ""))) is not None:
            return handler

        async def deny(request_or_iterator, context):
            await self._refusals.hold(grpc.StatusCode.UNAUTHENTICATED)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

        async def deny_stream(request_or_iterator, context):
            await deny(request_or_iterator, context)
            yield  # pragma: no cover - abort raises

        if handler.response_streaming:
            make = grpc.stream_stream_rpc_method_handler if handler.request_streaming else grpc.unary_stream_rpc_method_handler
            return make(deny_stream, handler.request_deserializer, handler.response_serializer)
        make = grpc.stream_unary_rpc_method_handler if handler.request_streaming else grpc.unary_unary_rpc_method_handler
        return make(deny, handler.request_deserializer, handler.response_serializer)


class VerifierServer:
    def __init__(self, engine: TargetEngine, config: ServerConfig, metrics: ServiceMetrics | None = None) -> None:
        self.engine = engine
        self.config = config
        self.metrics = metrics or ServiceMetrics()
        self.credentials = config.verified_by()  # (``reload`` it on SIGHUP: the servicer and the interceptor share it)
        self.servicer = VerifierServicer(engine, config.limits, self.metrics, batching=config.batching,
                                         identities=Identities(self.credentials, by_certificate=bool(config.tls_client_ca)))
        self.port: int | None = None
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        self._reaper: asyncio.Task | None = None
        self._metrics_http = None  # the Prometheus HTTP(S) server, with metrics_port
        self.fleet = None  # shared.fleet.FleetClient with mqtt_url
        self._fleet_task: asyncio.Task | None = None

    async def start(self) -> int:
        cfg = self.config
        # Requests that do not parse reach the servicer as ``Malformed`` (INVALID_ARGUMENT), tokenless or not.
        auth = [] if self.credentials is None else [_BearerAuth(self.credentials, self.servicer.refusals)]
        interceptors = [ParseRequests(SERVICE_NAME), *auth]
        server = grpc.aio.server(
            interceptors=interceptors,
            options=SERVER_OPTIONS,
        )
        pb_grpc.add_VerifierServicer_to_server(self.servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection([SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
        address = f"{cfg.host}:{cfg.port}"
        try:
            if cfg.tls_cert and cfg.tls_key:
                credentials = grpc.ssl_server_credentials([(cfg.tls_key, cfg.tls_cert)], root_certificates=cfg.tls_client_ca,
                                                          require_client_auth=bool(cfg.tls_client_ca))
                self.port = server.add_secure_port(address, credentials)
            else:
                # Loopback without TLS: edges send their token over local credentials
                # (gRPC sends call credentials only over a secure channel).
                self.port = server.add_insecure_port(address)
        except RuntimeError as exc:  # grpc raises a bare "Failed to bind" for a taken port
            self.port = 0
            cause = exc
        else:
            cause = None
        if not self.port:
            raise OSError(f"cannot listen on {address}: the port is in use or the address is not this machine's") from cause
        await server.start()
        self._server = server
        for name in ("", SERVICE_NAME):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if cfg.metrics_port is not None:
            try:
                self._metrics_http = self.metrics.serve(cfg.metrics_port, cfg.metrics_host, cfg.tls_cert, cfg.tls_key)
            except OSError as exc:
                await server.stop(0)
                raise OSError(f"cannot serve metrics on {cfg.metrics_host}:{cfg.metrics_port}: {exc.strerror or exc}") from exc
        self._reaper = asyncio.create_task(self._reap_forever())
        self.servicer.replica = cfg.replica or f"{socket.gethostname()}-{self.port}"
        if cfg.mqtt_url:
            from cloud.fleet import report_load_forever
            from shared.fleet import FleetClient

            self.fleet = FleetClient(cfg.mqtt_url, "cloud", self.servicer.replica).start()
            self.fleet.set_status(state="online", model=self.engine.model_name, port=self.port)
            self._fleet_task = asyncio.create_task(report_load_forever(self.servicer, self.fleet))
        log.info("verifier listening on %s:%d%s", cfg.host, self.port, " (mutual TLS)" if cfg.tls_client_ca else " (TLS)" if cfg.tls_cert else "")
        if self._metrics_http is not None:
            log.info("metrics on %s://%s:%d/metrics", "https" if cfg.tls_cert else "http", cfg.metrics_host,
                     self._metrics_http.server_port)
        return self.port

    @property
    def metrics_port(self) -> int | None:
        """The port the Prometheus metrics are served on (None without ``metrics_port``)."""
        return self._metrics_http.server_port if self._metrics_http is not None else None

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(max(1.0, min(30.0, self.config.limits.session_ttl_s / 4)))
            if self.servicer.table.reap():
                self.metrics.sessions_active.set(len(self.servicer.table))

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting calls; let in-flight ones run up to ``grace`` seconds."""
        if self._server is None:
            return
        await self._health.enter_graceful_shutdown()
        if self._reaper:
            self._reaper.cancel()
        if self.fleet is not None:
            self._fleet_task.cancel()
            await asyncio.get_running_loop().run_in_executor(None, self.fleet.stop)
        await self._server.stop(self.config.grace_s if grace is None else grace)
        self.servicer.scheduler.shutdown(wait=True)
        self._server = None
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()
            self._metrics_http = None

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()


class BackgroundServer:
    """A ``VerifierServer`` on its own thread and event loop (context manager)."""

    def __init__(self, engine: TargetEngine, config: ServerConfig) -> None:
        self.server = VerifierServer(engine, config)
        self._loop = LoopThread("verifier-server")

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def address(self) -> str:
        return f"{self.server.config.host}:{self.server.port}"

    def start(self) -> BackgroundServer:
        self._loop.start()
        self._loop.run(self.server.start(), timeout=30)
        return self

    def stop(self, grace: float = 1.0) -> None:
        self._loop.run(self.server.stop(grace), timeout=grace + 30)
        self._loop.stop()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
