"""The capture store's Prometheus metrics: every request by route, role and status, timed.

The store sits on every model call (resolve, begin, put, stage), so its
latency histograms start at half a millisecond (`STORE_LATENCY_BUCKETS_S`).
Registry, worker sum (`store serve --workers N`) and exposition are the
finalizer's (`token_finalizer._prometheus`). `StoreMetricsMiddleware` counts
each request once, after its answer, whoever answered it (the bearer check's
401 and 403 included); the route label is the route's short name
(`ROUTE_NAMES`), never the raw path, so ids cannot blow up the cardinality.
The memory and health gauges are set from each `/health` verdict the server
computes (`note_health`, also run by every scrape of `/metrics`). Every
family is listed in docs/store-protocol.md#metrics.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from token_finalizer._constants import STORE_LATENCY_BUCKETS_S
from token_finalizer._prometheus import AppMetrics
from token_finalizer.store_server.roles import (
    ANY_TOKEN_ROUTES,
    ATTACHMENTS_ROUTE,
    CALL_ROUTE,
    CONTROL_MANIFEST_ROUTE,
    OPEN_ROUTES,
    ROUTE_ROLES,
    STAGE_ROUTE,
    route_pattern,
)
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
    ("GET", "/metrics"): "metrics",
}
# Routes whose successful answers stored a capture: their bodies are counted.
_STORING = frozenset({"put", "stage"})
_OTHER = "other"

# Attachments before the staged call they hang off: the first pattern that matches wins.
_ROUTES: tuple[tuple[str, Any, str, str], ...] = tuple(
    (
        method,
        route_pattern(path),
        ROUTE_NAMES.get((method, path), path),
        "open"
        if (method, path) in OPEN_ROUTES
        else "any"
        if (method, path) in ANY_TOKEN_ROUTES
        else str(ROUTE_ROLES[(method, path)]),
    )
    for method, path in sorted(
        {*ROUTE_ROLES, *OPEN_ROUTES, *ANY_TOKEN_ROUTES}, key=lambda route: -len(route[1])
    )
)


def _route_of(method: str, path: str) -> tuple[str, str]:
    """(route label, role label) of a request; ("other", "none") for a path no route serves."""
    for route_method, pattern, name, role in _ROUTES:
        if route_method == method and pattern.match(path):
            return name, role
    return _OTHER, "none"


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
            "Writes refused with 507 because the store's memory is above its high-water mark.",
            ["route"],
            registry=self.registry,
        )
        # Figures of the backend, the same whichever worker read them last.
        self.memory_used = Gauge(
            "token_finalizer_store_memory_used_bytes",
            "Memory the store's backend uses (Redis used_memory), as last read by /health.",
            registry=self.registry,
            multiprocess_mode="mostrecent",
        )
        self.memory_max = Gauge(
            "token_finalizer_store_memory_max_bytes",
            "The backend's memory limit (Redis maxmemory; 0: none), as last read by /health.",
            registry=self.registry,
            multiprocess_mode="mostrecent",
        )
        self.evicted_keys = Gauge(
            "token_finalizer_store_evicted_keys",
            "Keys the store's Redis evicted since it started (INFO stats evicted_keys).",
            registry=self.registry,
            multiprocess_mode="mostrecent",
        )
        self.healthy = Gauge(
            "token_finalizer_store_healthy",
            "1 when the last /health verdict was 200, 0 when it was 503.",
            registry=self.registry,
            multiprocess_mode="mostrecent",
        )
        self.shard_writable = Gauge(
            "token_finalizer_store_shard_writable",
            "Per Redis Cluster primary: 1 when it can take writes (reachable, with the "
            "replicas min_replicas_acked needs), else 0.",
            ["node"],
            registry=self.registry,
            multiprocess_mode="mostrecent",
        )

    def observe(self, method: str, path: str, status: int, seconds: float, body_bytes: int) -> None:
        """Count one answered request (and the capture it stored, if any)."""
        route, role = _route_of(method, path)
        self.requests.labels(route, role, str(status)).inc()
        self.request_seconds.labels(route).observe(seconds)
        if status == 507:
            self.full_refusals.labels(route).inc()
        if route in _STORING and 200 <= status < 300:
            self.entries_stored.labels(route).inc()
            self.stored_bytes.labels(route).inc(body_bytes)

    def set_memory(
        self, *, used_bytes: float, max_bytes: float, evicted_keys: float | None = None
    ) -> None:
        """The backend's memory figures (§22): what the health/memory check read."""
        self.memory_used.set(used_bytes)
        self.memory_max.set(max_bytes)
        if evicted_keys is not None:
            self.evicted_keys.set(evicted_keys)

    def set_shard_writable(self, node: str, writable: bool) -> None:
        """One cluster primary's verdict: can it take writes now."""
        self.shard_writable.labels(node).set(1 if writable else 0)

    def note_health(self, status_code: int, body: Mapping[str, Any]) -> None:
        """Set the gauges from one /health verdict: its status and the figures it carries.

        Reads `memory: {used, max}` and `evicted_keys` (top level or under
        `memory`) when present (docs/store-protocol.md#health).
        """
        self.healthy.set(1 if status_code == 200 else 0)
        memory = body.get("memory")
        if not isinstance(memory, Mapping):
            return
        used, limit = memory.get("used"), memory.get("max")
        evicted = memory.get("evicted_keys", body.get("evicted_keys"))
        if isinstance(used, int | float) and isinstance(limit, int | float):
            self.set_memory(
                used_bytes=used,
                max_bytes=limit,
                evicted_keys=evicted if isinstance(evicted, int | float) else None,
            )


class StoreMetricsMiddleware:
    """Times and counts every HTTP request once its answer is complete (pure ASGI)."""

    def __init__(self, app: ASGIApp, metrics: StoreMetrics) -> None:
        self.app = app
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        received = 0
        done = False

        def finish() -> None:
            nonlocal done
            done = True
            seconds = time.perf_counter() - started
            self._metrics.observe(scope["method"], scope["path"], status, seconds, received)

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
            return message

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                # Counted before the last byte leaves: whoever saw the answer
                # can already see it in /metrics.
                finish()
            await send(message)

        try:
            await self.app(scope, counted_receive, send_and_note)
        finally:
            if not done:  # the app raised, or never finished its answer
                finish()
