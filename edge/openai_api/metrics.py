"""The OpenAI API's Prometheus metrics, in a registry of their own (``GET /metrics`` exposes it).

Requests are counted by endpoint and status, generations by who served them; completion
tokens and the time to first token are observed once per generation. Speculative decoding is
counted under vLLM's names too (``vllm:spec_decode_*``: steps, draft tokens, accepted ones, accepted
ones by position), so a dashboard built for vLLM reads an edge.
"""

from __future__ import annotations

from edge.serving import Outcome

__all__ = ["ServerMetrics"]


class VllmSpecCounters:
    """vLLM's speculative-decoding counters (``vllm/v1/spec_decode/metrics.py``), fed per generation."""

    def __init__(self, registry) -> None:
        from prometheus_client import Counter

        self.drafts = Counter("vllm:spec_decode_num_drafts", "Speculative steps (drafted blocks and chains)",
                              registry=registry)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Draft tokens sent for verification",
                                    registry=registry)
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted", registry=registry)
        self.accepted_at = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                   "Draft tokens accepted, by position in the block", ["position"], registry=registry)

    def observe(self, outcome: Outcome) -> None:
        stats = outcome.decode
        self.drafts.inc(sum(stats.accept_lengths.values()))
        self.draft_tokens.inc(stats.drafted)
        self.accepted.inc(stats.accepted)
        for position, count in enumerate(stats.accepted_at):
            if count:
                self.accepted_at.labels(position=str(position)).inc(count)


class ServerMetrics:
    """The counters of one app; ``prometheus_client`` is imported only when one is made."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter("splitspec_edge_requests", "HTTP requests", ["endpoint", "status"],
                                registry=self.registry)
        self.served = Counter("splitspec_edge_generations", "Generations by who served them", ["served_by"],
                              registry=self.registry)
        self.tokens = Counter("splitspec_edge_completion_tokens", "Completion tokens returned", registry=self.registry)
        self.ttft = Histogram("splitspec_edge_ttft_seconds", "Time to first token", registry=self.registry,
                              buckets=(0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30))
        self.spec = VllmSpecCounters(self.registry)

    def count(self, endpoint: str, status: int) -> None:
        """One request to ``endpoint`` answered with ``status``."""
        self.requests.labels(endpoint, str(status)).inc()

    def record(self, endpoint: str, outcome: Outcome) -> None:
        """A generation that reached its end, whole or streamed (a 200)."""
        self.count(endpoint, 200)
        self.served.labels(outcome.served_by).inc()
        self.tokens.inc(len(outcome.tokens))
        self.spec.observe(outcome)

    def exposition(self) -> tuple[bytes, str]:
        """The registry in Prometheus' text format, and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
