"""The finalizer's Prometheus metrics: what POST /finalize, /retire and the sources count,
and whether each shard of a source can take writes
(docs/finalizer-api.md#health-readiness-metrics).

The registry, the sum over `serve --workers N` and the exposition are
shared with the store server (`token_finalizer._prometheus`).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from token_finalizer._constants import LATENCY_BUCKETS_S
from token_finalizer._prometheus import (
    CONTENT_TYPE_LATEST,
    MULTIPROC_DIR_ENV_VAR,
    AppMetrics,
    multiprocess_directory,
    multiprocess_enabled,
    prepare_multiprocess_directory,
    prepare_operator_directory,
)

__all__ = [
    "CONTENT_TYPE_LATEST",
    "MULTIPROC_DIR_ENV_VAR",
    "ServiceMetrics",
    "multiprocess_directory",
    "multiprocess_enabled",
    "prepare_multiprocess_directory",
    "prepare_operator_directory",
]

# Paths get their own latency label; anything else (404s, /docs) shares "other"
# so arbitrary URLs cannot blow up the label cardinality.
_ENDPOINTS = frozenset({"/finalize", "/retire", "/health", "/ready", "/metrics"})


class ServiceMetrics(AppMetrics):
    """The counters and histograms the service updates, and their text exposition."""

    def __init__(self) -> None:
        super().__init__()
        self.finalize = Counter(
            "token_finalizer_finalize",
            "Finalize calls by source and outcome (ok, masked, no_build, unreachable).",
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
        self.guard_unavailable = Counter(
            "token_finalizer_guard_unavailable",
            "Guard steps (check, observe) skipped because the shared guard's Redis failed "
            "or was being left alone after a failure; the finalize went on unguarded.",
            ["operation"],
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

        # Set by each /ready probe of a redis source with min_replicas_acked; with
        # --workers, the value the most recent worker read.
        self.source_shard_writable = Gauge(
            "token_finalizer_source_shard_writable",
            "Per Redis primary of a redis source with min_replicas_acked, by source and node: "
            "1 when it can take writes at the last /ready probe (reachable, with enough "
            "connected replicas), else 0.",
            ["source", "node"],
            registry=self.registry,
            multiprocess_mode="mostrecent",
        )

    def observe_request(self, path: str, status: int, seconds: float) -> None:
        """Record one answered request's latency (other paths share one label)."""
        endpoint = path if path in _ENDPOINTS else "other"
        self.request_seconds.labels(endpoint, str(status)).observe(seconds)
