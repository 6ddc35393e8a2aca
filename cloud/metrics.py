"""Prometheus metrics of the verifier service, in their own registry.

The same counters that ``shared.stats.DecodeStats`` keeps per generation,
summed over the service, plus bytes on the wire and verify latency. Sessions
and rounds are fed through two observers, ``observe_open`` and
``observe_round`` (vLLM's ``SpecDecodingProm.observe`` shape); nothing else
increments those counters. Per-client verify work (``observe_client``) is
labelled by a bucket of the client's hash (``CLIENT_BUCKETS`` of them), so
label cardinality stays bounded whatever the clients.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary, start_http_server

from shared.stats import RoundRecord

__all__ = ["CLIENT_BUCKETS", "ClientSeries", "EngineSeries", "ServiceMetrics", "VERIFY_SERVICE_METRIC", "client_bucket"]

VERIFY_SERVICE_METRIC = "splitspec_verify_service_seconds"  # a Summary by rows: what the performance-model fit reads

CLIENT_BUCKETS = 32  # per-client series: at most this many label values

_EXACT_ROWS = 64  # verify steps of up to this many rows are labelled exactly
_LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


def client_bucket(client: str) -> str:
    """The label of ``client``'s bucket: stable across processes (not Python's salted ``hash``)."""
    return str(int.from_bytes(hashlib.sha256(client.encode()).digest()[:4], "big") % CLIENT_BUCKETS)


class EngineSeries:
    """The packed target forwards: how many, their rows and sessions, the time inside them."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.forwards = Counter("splitspec_engine_forwards",
                                "Packed target forwards (each may carry many sessions' rows)", registry=registry)
        self.rows = Counter("splitspec_engine_rows", "Token rows in packed forwards (padding excluded)",
                            registry=registry)
        self.sequences = Histogram(
            "splitspec_engine_sequences", "Sessions sharing one packed forward",
            buckets=(1, 2, 4, 8, 16, 32, 64), registry=registry,
        )
        self.busy = Counter("splitspec_engine_busy_seconds", "Wall time inside target forwards", registry=registry)

    def observe(self, *, rows: int, sequences: int, seconds: float) -> None:
        self.forwards.inc()
        self.rows.inc(rows)
        self.sequences.observe(sequences)
        self.busy.inc(seconds)


class ClientSeries:
    """Per-client verify work, labelled by the client's bucket (``client_bucket``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.rows = Counter("splitspec_client_rows", "Verified rows run, by client bucket", ["client"],
                            registry=registry)
        self.committed = Counter(
            "splitspec_client_committed_tokens", "Tokens committed by verify steps, by client bucket", ["client"],
            registry=registry,
        )
        self.capped = Counter(
            "splitspec_client_capped_steps", "Verify steps of clients held at the fair-share weight floor",
            ["client"], registry=registry,
        )

    def observe(self, client: str, *, rows: int, committed: int, capped: bool) -> None:
        label = client_bucket(client)
        self.rows.labels(client=label).inc(rows)
        self.committed.labels(client=label).inc(committed)
        if capped:
            self.capped.labels(client=label).inc()


class ServiceMetrics:
    """The service's registry: session and round counters here, the engine's and the clients' series
    in rooms of their own (``engine``, ``clients``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions_opened = Counter("splitspec_sessions_opened", "Decode sessions opened", registry=r)
        self.sessions_active = Gauge("splitspec_sessions_active", "Sessions in the session table", registry=r)
        self.sessions_resumed = Counter(
            "splitspec_sessions_resumed", "Sessions reattached by ticket after a broken stream", registry=r
        )
        self.misrouted = Counter(
            "splitspec_misrouted_streams", "Resumes and next turns that named another replica", registry=r
        )
        self.sessions_failed = Counter("splitspec_sessions_failed", "Sessions ended by an error", ["code"], registry=r)
        self.forged_drafts = Counter(
            "splitspec_forged_drafts", "Rejection-mode sessions ended by the draft audit, by check "
            "(unsampled: a draft not its q̃'s sample; improbable: drafts too surprising under their q̃)",
            ["check"], registry=r,
        )
        self.drafted = Counter("splitspec_drafted_tokens", "Draft tokens received for verification", registry=r)
        self.accepted = Counter("splitspec_accepted_tokens", "Draft tokens accepted", registry=r)
        self.accepted_at = Counter(
            "splitspec_accepted_at_position", "Drafts accepted, by position in the block", ["position"], registry=r
        )
        self.generated = Counter("splitspec_generated_tokens", "Tokens committed, all RPCs", registry=r)
        self.forwards = Counter("splitspec_target_forwards", "Target forward passes", registry=r)
        self.bytes_in = Counter("splitspec_bytes_in", "gRPC message bytes received (5-byte prefix included)", registry=r)
        self.bytes_out = Counter("splitspec_bytes_out", "gRPC message bytes sent (5-byte prefix included)", registry=r)
        self.verify_latency = Histogram(
            "splitspec_verify_latency_seconds", "Verify step wall time, forward included", buckets=_LATENCY_BUCKETS, registry=r
        )
        # Queueing behind the session's earlier blocks excluded (unlike the latency): what a step costs,
        # by the session's rows in its forward, which the performance model fits its verify line on.
        # Under load a step also waits for its packed forward, batch-mates' rows included. Rows above
        # _EXACT_ROWS are labelled by the power of two at or above them (a bounded label set; a fit reads
        # such steps at that bound).
        self.verify_service = Summary(
            VERIFY_SERVICE_METRIC,
            "A session's verify step from its start on the engine to its verdicts (forward, verification, sampling)",
            ["rows"], registry=r,
        )
        self.engine = EngineSeries(r)
        self.clients = ClientSeries(r)
        self.service_overhead = Histogram(
            "splitspec_verify_overhead_seconds",
            "Per-verify service time outside the target forward",
            buckets=(0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05),
            registry=r,
        )

    def observe_open(self, *, forwards: int) -> None:
        """A session opened; its prefill ran ``forwards`` target forwards."""
        self.forwards.inc(forwards)

    def observe_round(self, record: RoundRecord, *, latency_s: float, overhead_s: float) -> None:
        """One verify round: its counters, its wall time and the service time outside the forward."""
        self.verify_latency.observe(latency_s)
        self.service_overhead.observe(overhead_s)
        self.forwards.inc(record.forwards)
        self.drafted.inc(record.drafted)
        self.accepted.inc(record.accepted)
        self.generated.inc(record.committed)
        for i in range(record.accepted):
            self.accepted_at.labels(position=str(i)).inc()

    def observe_step(self, *, rows: int, seconds: float) -> None:
        """One session's verify step that ran a forward of ``rows`` rows for it."""
        label = rows if rows <= _EXACT_ROWS else 1 << (rows - 1).bit_length()
        self.verify_service.labels(rows=str(label)).observe(seconds)

    def observe_client(self, client: str, *, rows: int, committed: int, capped: bool) -> None:
        """A verify step of ``client``'s: its rows, the tokens they committed, whether it is capped."""
        self.clients.observe(client, rows=rows, committed=committed, capped=capped)

    def observe_forward(self, *, rows: int, sequences: int, seconds: float) -> None:
        """One packed target forward (called on the engine thread)."""
        self.engine.observe(rows=rows, sequences=sequences, seconds=seconds)

    def serve(self, port: int, host: str = "127.0.0.1", tls_cert: bytes | None = None,
              tls_key: bytes | None = None) -> WSGIServer:
        """Serve the registry over HTTP on ``host``:``port`` (HTTPS with the PEM ``tls_cert`` and
        ``tls_key``) on a thread of its own; the caller shuts the returned server down."""
        if tls_cert is None:
            server, _ = start_http_server(port, addr=host, registry=self.registry)
            return server
        # The TLS context reads files: the PEMs live in a private (0700) folder only while it loads them.
        with tempfile.TemporaryDirectory(prefix="splitspec-metrics-tls-") as folder:
            cert, key = Path(folder) / "cert.pem", Path(folder) / "key.pem"
            cert.write_bytes(tls_cert)
            key.write_bytes(tls_key or b"")
            server, _ = start_http_server(port, addr=host, registry=self.registry, certfile=str(cert),
                                          keyfile=str(key))
        return server
