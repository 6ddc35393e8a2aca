"""What ``edge serve`` knows of its verifier: ready, loading or degraded, from the cloud's own gRPC
health service (``grpc.health.v1``, open without a token), asked at most once a second.

Contract. ``CloudHealth.state()`` never raises and never waits longer than its probe timeout; the
answer is cached for ``ttl_s``. "ready": the verifier's health service says SERVING. "loading": it
has not said so since this edge started (the verifier is starting, loading its model, or not there
yet). "degraded": it did, and now does not answer or says NOT_SERVING (draining, gone). ``service_health``
turns that and the fallback into ``/health``'s answer (pure).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from edge.channel import describe_rpc_error
from edge.endpoint import VerifierEndpoint
from protos import splitspec_pb2 as pb

__all__ = ["CloudHealth", "CloudState", "ServiceHealth", "service_health", "READY", "LOADING", "DEGRADED"]

READY, LOADING, DEGRADED = "ready", "loading", "degraded"
VERIFIER_SERVICE = pb.DESCRIPTOR.services_by_name["Verifier"].full_name  # the name its health is kept under


@dataclass(frozen=True)
class CloudState:
    state: str  # READY, LOADING or DEGRADED
    reason: str = ""  # why it is not READY
    checked_at: float = 0.0  # time.monotonic() of the probe that said so


@dataclass(frozen=True)
class ServiceHealth:
    """``/health``'s answer: ``status`` "ok" (HTTP 200), else the cloud's state (HTTP 503)."""

    status: str  # "ok", LOADING or DEGRADED
    cloud: CloudState
    serving: str | None  # "split", "drafter-only" or None (nothing can be served)

    @property
    def http_status(self) -> int:
        return 200 if self.status == "ok" else 503


def service_health(cloud: CloudState, fallback: str) -> ServiceHealth:
    """Ready cloud: "ok", split decoding. Otherwise "ok" drafter-only with ``fallback`` "local", else the
    cloud's state (503, as llama-server answers while it loads)."""
    if cloud.state == READY:
        return ServiceHealth("ok", cloud, "split")
    if fallback == "local":
        return ServiceHealth("ok", cloud, "drafter-only")
    return ServiceHealth(cloud.state, cloud, None)


class CloudHealth:
    """Probes ``endpoint``'s health service over a channel of its own; thread-safe."""

    def __init__(self, endpoint: VerifierEndpoint, *, ttl_s: float = 1.0, timeout_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.endpoint, self.ttl_s, self.timeout_s, self.clock = endpoint, ttl_s, timeout_s, clock
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._last: CloudState | None = None
        self._was_ready = False

    def state(self) -> CloudState:
        """The cached answer, or a fresh probe when it is older than ``ttl_s``."""
        with self._lock:
            last = self._last
            if last is not None and self.clock() - last.checked_at < self.ttl_s:
                return last
            self._last = self._probe()
            return self._last

    def _probe(self) -> CloudState:
        address = self.endpoint.address
        try:
            if self._channel is None:
                self._channel = self.endpoint.open_channel()
            status = health_pb2_grpc.HealthStub(self._channel).Check(
                health_pb2.HealthCheckRequest(service=VERIFIER_SERVICE), timeout=self.timeout_s).status
        except grpc.RpcError as error:
            return self._not_ready(f"the verifier at {address} does not answer ({describe_rpc_error(error)})")
        except ValueError as exc:  # the endpoint refuses to send its token in cleartext
            return self._not_ready(str(exc))
        if status == health_pb2.HealthCheckResponse.SERVING:
            self._was_ready = True
            return CloudState(READY, "", self.clock())
        name = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
        return self._not_ready(f"the verifier at {address} reports {name}")

    def _not_ready(self, reason: str) -> CloudState:
        return CloudState(DEGRADED if self._was_ready else LOADING, reason, self.clock())

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None
