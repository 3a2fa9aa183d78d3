"""GET /health of the capture store: the server answers, and so does the store behind it.

A store server whose Redis is down (or whose directory is gone) must not look
healthy: the finalizer's `/ready` probes this route for each `http` source,
and load balancers and compose healthchecks read it too. The backend is
pinged with a deadline below the finalizer's own probe budget, so the
finalizer sees this verdict and its error, not a timeout of its own.

A redis store also reports its memory (`"memory": {"used", "max",
"fraction", "high_water"}`) and is 503 `memory_full` above its high-water
mark (writes that add capture data are refused; freeze and retire work) or
503 `captures_evicted` once Redis evicted keys while this server ran.
See docs/store-protocol.md#health and docs/capacity.md.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from token_finalizer._constants import STORE_HEALTH_TIMEOUT_S
from token_finalizer.core.errors import CaptureError, StoreNodeUnreachable, describe_exception
from token_finalizer.core.redaction import redact
from token_finalizer.sources.base import CaptureStore, MemoryHealth

__all__ = ["Health", "store_health"]


@dataclass(frozen=True, slots=True)
class Health:
    """The status code and body of one /health answer."""

    status_code: int
    body: dict[str, Any]


_HEALTHY = Health(200, {"status": "ok"})
_WHY = {
    "memory_full": "the store's memory is above its high-water mark: writes that add "
    "capture data are refused (507) until freezes and retires free it",
    "eviction_policy": "Redis's maxmemory-policy may evict capture keys: run `CONFIG SET "
    "maxmemory-policy noeviction` (docs/capacity.md#eviction)",
    "captures_evicted": "Redis evicted {evicted} key(s) since this server started: captures "
    "may be lost; set maxmemory-policy noeviction (docs/capacity.md#eviction)",
}


async def _probe(store: CaptureStore) -> MemoryHealth | None:
    await store.ping()
    return await store.memory_health()


def _memory_verdict(store: CaptureStore, memory: MemoryHealth) -> Health:
    if memory.status is None:
        return Health(200, {"status": "ok", "memory": memory.memory})
    error = _WHY.get(memory.status, memory.status).format(evicted=memory.evicted_keys)
    body: dict[str, Any] = {
        "status": memory.status,
        "store": store.kind,
        "error": error,
        "memory": memory.memory,
    }
    if memory.status == "captures_evicted":
        body["evicted_keys"] = memory.evicted_keys
    return Health(503, body)


def _node(store: CaptureStore) -> str | None:
    """The Redis node a redis store talks to; None for other stores (redis-py stays unloaded)."""
    if store.kind != "redis":
        return None
    from token_finalizer.sources.redis import RedisTokenStore

    return store.node if isinstance(store, RedisTokenStore) else None


async def store_health(store: CaptureStore, *, timeout_s: float = STORE_HEALTH_TIMEOUT_S) -> Health:
    """200 `{"status": "ok"}` when the store answers its ping in time, else 503 saying why.

    A store with a memory limit adds `memory`, and is 503 `memory_full` or
    `captures_evicted` (with `error` and `store`) when its memory says so.

    503 body: `{"status": "unhealthy", "store": kind, "error": ...}`; a redis
    store adds `"redis": {"reachable": false, "node": "host:port", "error": ...}`,
    naming the node that did not answer (of a cluster: the first primary down).
    """
    node: str | None = None
    try:
        memory = await asyncio.wait_for(_probe(store), timeout=timeout_s)
    except TimeoutError:
        error = f"the {store.kind} store did not answer within {timeout_s:g}s"
    except StoreNodeUnreachable as exc:
        # The store pinged each of its servers and names the one that is down.
        node, error = exc.node, redact(str(exc))
    except CaptureError as exc:
        error = redact(str(exc))
    except Exception as exc:  # a health check answers, whatever the backend raised
        error = redact(describe_exception(exc))
    else:
        return _HEALTHY if memory is None else _memory_verdict(store, memory)
    if node is None:
        node = _node(store)
        if node is None:
            return Health(503, {"status": "unhealthy", "store": store.kind, "error": error})
        error = f"redis node {node}: {error}"
    redis = {"reachable": False, "node": node, "error": error}
    return Health(503, {"status": "unhealthy", "store": store.kind, "error": error, "redis": redis})
