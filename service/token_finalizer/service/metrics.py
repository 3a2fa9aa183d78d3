"""Prometheus metrics of one app, in a registry of its own.

A per-app CollectorRegistry (not the process-global one) lets several apps
live in one process, as tests and embedders do, without name clashes. With
several uvicorn workers each process answers /metrics with its own counts.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from token_finalizer._constants import LATENCY_BUCKETS_S

__all__ = ["CONTENT_TYPE_LATEST", "ServiceMetrics"]

# Paths get their own latency label; anything else (404s, /docs) shares "other"
# so arbitrary URLs cannot blow up the label cardinality.
_ENDPOINTS = frozenset({"/finalize", "/retire", "/health", "/ready", "/metrics"})


class ServiceMetrics:
    """The counters and histograms the service updates, and their text exposition."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.finalize = Counter(
            "token_finalizer_finalize",
            "Finalize calls answered with a record, by source and outcome (ok, masked, no_build).",
            ["source", "outcome"],
            registry=self.registry,
        )
        self.mask_reasons = Counter(
            "token_finalizer_mask_reasons",
            "Masked builds by source and short reason.",
            ["source", "reason"],
            registry=self.registry,
        )
        self.guard_refusals = Counter(
            "token_finalizer_guard_refusals",
            "Finalize calls refused with 409 by the per-run mask-fraction guard.",
            registry=self.registry,
        )
        self.retire = Counter(
            "token_finalizer_retire",
            "Retire calls by source and outcome (retired, stale, failed).",
            ["source", "outcome"],
            registry=self.registry,
        )
        self.source_errors = Counter(
            "token_finalizer_source_errors",
            "Exceptions raised by a source, by source and operation (freeze, drop, ping).",
            ["source", "operation"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "token_finalizer_request_seconds",
            "Time from request start to the answer being ready, by endpoint and status.",
            ["endpoint", "status"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.source_seconds = Histogram(
            "token_finalizer_source_seconds",
            "Time spent in a source call, by source and operation.",
            ["source", "operation"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )

    def observe_request(self, path: str, status: int, seconds: float) -> None:
        """Record one answered request's latency (other paths share one label)."""
        endpoint = path if path in _ENDPOINTS else "other"
        self.request_seconds.labels(endpoint, str(status)).observe(seconds)

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric of this app."""
        return generate_latest(self.registry)
