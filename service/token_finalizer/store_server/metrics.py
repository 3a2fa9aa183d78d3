"""The capture store's Prometheus metrics: every request by route, role and status, timed.

The store sits on every model call (resolve, begin, put, stage), so its
latency histograms start at half a millisecond (`STORE_LATENCY_BUCKETS_S`).
Registry, worker sum (`store serve --workers N`) and exposition are the
finalizer's (`token_finalizer._prometheus`). `StoreMetricsMiddleware` counts
each request once, after its answer, whoever answered it (the bearer check's
401 and 403 included); the route label is the short name (`ROUTE_NAMES`) of
the route the router serves the request with (the guard's own matcher,
store_server/_route_access.py), never the raw path, so ids cannot blow up
the cardinality. The memory, health and shard gauges are set from each
`/health` verdict the server computes (`note_health`, also run by every
scrape of `/metrics`). Every family is listed in docs/store-protocol.md#metrics.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from prometheus_client import Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from token_finalizer._constants import STORE_LATENCY_BUCKETS_S
from token_finalizer._prometheus import AppMetrics
from token_finalizer.store_server._health import Health
from token_finalizer.store_server._route_access import RouteOf
from token_finalizer.store_server.roles import (
    ANY_TOKEN_ROUTES,
    ATTACHMENTS_ROUTE,
    CALL_ROUTE,
    CONTROL_MANIFEST_ROUTE,
    OPEN_ROUTES,
    ROUTE_ROLES,
    STAGE_ROUTE,
)
from token_finalizer.web.answer_done import call_until_answered
from token_finalizer_client.protocol import ROLLOUT_ROUTE

__all__ = ["ROUTE_NAMES", "StoreMetrics", "StoreMetricsMiddleware"]

# (method, route as mounted) -> the `route` label. A route missing here is
# labelled by its template (still bounded: templates are few).
ROUTE_NAMES: Mapping[tuple[str, str], str] = {
    ("PUT", CALL_ROUTE): "put",
    ("POST", ROLLOUT_ROUTE + "/intents"): "begin",
    ("POST", ROLLOUT_ROUTE + "/incomplete"): "incomplete",
    ("POST", ROLLOUT_ROUTE + "/lineage/resolve"): "resolve",
    ("POST", ROLLOUT_ROUTE + "/freeze"): "freeze",
    ("POST", ROLLOUT_ROUTE + "/drop"): "drop",
    ("POST", ROLLOUT_ROUTE + "/ledger/records"): "ledger_records",
    ("POST", ROLLOUT_ROUTE + "/ledger/failures"): "ledger_failures",
    ("GET", ROLLOUT_ROUTE + "/ledger/has-rows"): "ledger_has_rows",
    ("GET", ROLLOUT_ROUTE + "/ledger/manifest"): "ledger_manifest",
    ("PUT", STAGE_ROUTE): "stage",
    ("POST", ROLLOUT_ROUTE + "/staged/fetch"): "staged_fetch",
    ("POST", ROLLOUT_ROUTE + "/staged/extras"): "staged_extras",
    ("GET", ATTACHMENTS_ROUTE): "attachments",
    ("GET", CONTROL_MANIFEST_ROUTE): "control_manifest",
    ("GET", "/health"): "health",
    ("GET", "/capabilities"): "capabilities",
    ("GET", "/metrics"): "metrics",
}
# Routes whose successful answers stored a capture: their bodies are counted.
_STORING = frozenset({"put", "stage"})
# A path no route serves.
_UNROUTED = ("other", "none")


def _role(template: tuple[str, str]) -> str:
    if template in OPEN_ROUTES:
        return "open"
    if template in ANY_TOKEN_ROUTES:
        return "any"
    role = ROUTE_ROLES.get(template)
    return "none" if role is None else str(role)


# Every served template -> its (route, role) labels.
_LABELS: Mapping[tuple[str, str], tuple[str, str]] = {
    template: (ROUTE_NAMES.get(template, template[1]), _role(template))
    for template in (*ROUTE_ROLES, *OPEN_ROUTES, *ANY_TOKEN_ROUTES)
}


class StoreMetrics(AppMetrics):
    """The families the store server exports (docs/store-protocol.md#metrics)."""

    def __init__(self) -> None:
        super().__init__()
        self.requests = Counter(
            "token_finalizer_store_requests",
            "Requests answered by the store server, by route, the role it needs, and status.",
            ["route", "role", "status"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "token_finalizer_store_request_seconds",
            "Time from request start to the answer's last byte being handed over, by route.",
            ["route"],
            buckets=STORE_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.entries_stored = Counter(
            "token_finalizer_store_entries_stored",
            "Captures accepted (2xx) by route: put (a model call) and stage (a staged call).",
            ["route"],
            registry=self.registry,
        )
        self.stored_bytes = Counter(
            "token_finalizer_store_stored_bytes",
            "Request body bytes of the accepted puts and stages, by route.",
            ["route"],
            registry=self.registry,
        )
        self.full_refusals = Counter(
            "token_finalizer_store_full_refusals",
            "Writes refused with 507 (memory above the high-water mark, Redis OOM, disk full).",
            ["route"],
            registry=self.registry,
        )
        # Figures of the backend, the same whichever worker read them last.
        self.memory_used = self._figure(
            "token_finalizer_store_memory_used_bytes",
            "Memory the store's Redis uses (used_memory; a cluster: its fullest primary).",
        )
        self.memory_max = self._figure(
            "token_finalizer_store_memory_max_bytes",
            "The store's Redis maxmemory (0: none), of the same primary.",
        )
        self.memory_fraction = self._figure(
            "token_finalizer_store_memory_fraction",
            "used / max of the fullest primary (0 without maxmemory).",
        )
        self.memory_high_water = self._figure(
            "token_finalizer_store_memory_high_water",
            "The fraction of maxmemory above which writes are refused with 507 (0: no mark).",
        )
        self.evicted_keys = self._figure(
            "token_finalizer_store_evicted_keys",
            "Keys the store's Redis evicted since it started (INFO evicted_keys, summed over "
            "primaries).",
        )
        self.healthy = self._figure(
            "token_finalizer_store_healthy",
            "1 when the last /health verdict was 200, 0 when it was 503.",
        )
        self.shard_reachable = self._figure(
            "token_finalizer_store_shard_reachable",
            "Per Redis primary (shard), by node: 1 when it answered the last health check.",
            ["node"],
        )
        self.shard_writable = self._figure(
            "token_finalizer_store_shard_writable",
            "Per Redis primary, by node: 1 when it can take writes (reachable, with at least "
            "min_replicas_acked connected replicas), else 0.",
            ["node"],
        )
        self.shard_replicas = self._figure(
            "token_finalizer_store_shard_replicas",
            "Per Redis primary, by node: its replicas connected and in sync (online).",
            ["node"],
        )

    def _figure(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
        """A gauge of the backend's state: the most recent value any worker set."""
        return Gauge(
            name,
            documentation,
            labels,
            registry=self.registry,
            multiprocess_mode="mostrecent",
        )

    def observe(
        self, template: tuple[str, str] | None, status: int, seconds: float, body_bytes: int
    ) -> None:
        """Count one answered request by its route template (and the capture it stored)."""
        route, role = _LABELS.get(template, _UNROUTED) if template is not None else _UNROUTED
        self.requests.labels(route, role, str(status)).inc()
        self.request_seconds.labels(route).observe(seconds)
        if status == 507:
            self.full_refusals.labels(route).inc()
        if route in _STORING and 200 <= status < 300:
            self.entries_stored.labels(route).inc()
            self.stored_bytes.labels(route).inc(body_bytes)

    def note_health(self, verdict: Health) -> None:
        """Set the gauges from one /health verdict: its status, memory and shards (§22)."""
        self.healthy.set(1 if verdict.status_code == 200 else 0)
        reading = verdict.memory
        if reading is not None:
            self.memory_used.set(reading.used)
            self.memory_max.set(reading.max)
            self.memory_fraction.set(reading.fraction or 0.0)
            self.memory_high_water.set(
                reading.high_water if reading.high_water is not None and reading.max else 0.0
            )
            self.evicted_keys.set(reading.evicted_keys)
        for shard in verdict.shards:
            self.shard_reachable.labels(shard.node).set(1 if shard.reachable else 0)
            self.shard_writable.labels(shard.node).set(1 if shard.writable else 0)
            self.shard_replicas.labels(shard.node).set(len(shard.online))


class StoreMetricsMiddleware:
    """Times and counts every HTTP request once its answer is complete (pure ASGI)."""

    def __init__(self, app: ASGIApp, metrics: StoreMetrics, route_of: RouteOf) -> None:
        self.app = app
        self._metrics = metrics
        self._route_of = route_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        # Matched before the app runs: the router adds to the scope as it dispatches.
        template = self._route_of(scope)
        received = 0

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
            return message

        def answered(status: int) -> None:
            self._metrics.observe(template, status, time.perf_counter() - started, received)

        await call_until_answered(self.app, scope, counted_receive, send, answered)
