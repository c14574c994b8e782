"""Prometheus metrics of the /predict endpoint, in a registry of the ingress replica's own.

With several ingress replicas, each exports its own counts; Prometheus sums them by `instance`
when it scrapes every replica (deploy/), and any one replica's /metrics is a sample.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32)  # up to the agents' MAX_BATCH_SIZE


class ServeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "satseq_predict_requests",
            "POST /predict requests by HTTP status",
            ["status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "satseq_predict_latency_seconds",
            "POST /predict latency, every status",
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.agent_generation = self._per_agent_histogram(
            "satseq_agent_generation_seconds",
            "engine time of an agent's samples for one request (its batch's engine call)",
            LATENCY_BUCKETS_S,
        )
        self.agent_batch_size = self._per_agent_histogram(
            "satseq_agent_batch_size",
            "requests answered by the engine call that answered a request (dynamic batching)",
            BATCH_SIZE_BUCKETS,
        )
        self.agreement = Histogram(
            "satseq_vote_agreement",
            "share of the team's votes that went to the winning answer",
            buckets=(0.2, 0.4, 0.5, 0.6, 0.8, 0.9, 1.0),
            registry=self.registry,
        )
        self.agent_failures = Counter(
            "satseq_agent_failures",
            "agents that failed or timed out on a request",
            ["agent"],
            registry=self.registry,
        )
        self.agent_up = Gauge(
            "satseq_agent_up",
            "1 while the agent is asked, 0 while its replica is being replaced (left out)",
            ["agent"],
            registry=self.registry,
        )

    def _per_agent_histogram(
        self, name: str, documentation: str, buckets: tuple[float, ...]
    ) -> Histogram:
        return Histogram(name, documentation, ["agent"], buckets=buckets, registry=self.registry)

    def export(self) -> bytes:
        return generate_latest(self.registry)
