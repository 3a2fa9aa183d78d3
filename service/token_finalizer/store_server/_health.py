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
A Redis Cluster (or a server with `min_replicas_acked`) also reports each
primary (`"shards"`) and is 503 `shard_unwritable`, naming the primary and
the replicas it lacks, while one has fewer connected replicas than
`min_replicas_acked`: every write to its slots would answer 503.
The verdict also carries the figures the metrics export (`memory`, `shards`).
See docs/store-protocol.md#health and docs/capacity.md.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from token_finalizer._constants import STORE_HEALTH_TIMEOUT_S
from token_finalizer.core.errors import CaptureError, StoreNodeUnreachable, describe_exception
from token_finalizer.core.redaction import redact
from token_finalizer.sources import redis_store_of
from token_finalizer.sources.base import CaptureStore, MemoryHealth

if TYPE_CHECKING:
    from token_finalizer.sources.redis._memory import MemoryReading
    from token_finalizer.sources.redis._shards import ShardReading

__all__ = ["SHARD_UNWRITABLE", "Health", "store_health"]

SHARD_UNWRITABLE = "shard_unwritable"


@dataclass(frozen=True, slots=True)
class Health:
    """The status code and body of one /health answer, and the figures read for it."""

    status_code: int
    body: dict[str, Any]
    # A redis store's last memory reading and primaries, for the metrics.
    memory: MemoryReading | None = None
    shards: tuple[ShardReading, ...] = ()


_HEALTHY = Health(200, {"status": "ok"})
_WHY = {
    "memory_full": "the store's memory is above its high-water mark: writes that add "
    "capture data are refused (507) until freezes and retires free it",
    "eviction_policy": "Redis's maxmemory-policy may evict capture keys: run `CONFIG SET "
    "maxmemory-policy noeviction` (docs/capacity.md#eviction)",
    "captures_evicted": "Redis evicted {evicted} key(s) since this server started: captures "
    "may be lost; set maxmemory-policy noeviction (docs/capacity.md#eviction)",
}


# Statuses that say more than a shard that cannot write: captures may be lost already.
_UNTRUSTED = frozenset({"captures_evicted", "eviction_policy"})


async def _probe(store: CaptureStore) -> tuple[MemoryHealth | None, tuple[ShardReading, ...]]:
    await store.ping()
    return await store.memory_health(), await _shards(store)


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
    """The Redis node a redis store talks to; None for other stores."""
    redis = redis_store_of(store)
    return None if redis is None else redis.node


async def _shards(store: CaptureStore) -> tuple[ShardReading, ...]:
    redis = redis_store_of(store)
    return () if redis is None else await redis.shard_health()


def _with_figures(store: CaptureStore, verdict: Health, *, down: str | None = None) -> Health:
    """The verdict with the redis store's latest memory reading and primaries (`down`, a
    primary that did not answer the ping, counted unreachable)."""
    redis = redis_store_of(store)
    if redis is None:
        return verdict
    shards = redis.shard_readings
    if down is not None and shards:
        from token_finalizer.sources.redis import ShardReading

        kept = tuple(shard for shard in shards if shard.node != down)
        shards = (*kept, ShardReading(down, False, needed=shards[0].needed, error="no PING"))
    return Health(verdict.status_code, verdict.body, redis.memory_reading, shards)


def _shard_verdict(
    store: CaptureStore, verdict: Health, shards: tuple[ShardReading, ...]
) -> Health:
    """503 `shard_unwritable` when a primary cannot take writes, else `verdict` with the shards."""
    from token_finalizer.sources.redis import unwritable_reason

    if not shards:
        return verdict
    shown = [shard.to_dict() for shard in shards]
    stuck = unwritable_reason(shards)
    if stuck is None or verdict.body.get("status") in _UNTRUSTED:
        return Health(verdict.status_code, {**verdict.body, "shards": shown})
    body: dict[str, Any] = {
        "status": SHARD_UNWRITABLE,
        "store": store.kind,
        "error": stuck,
        "shards": shown,
    }
    if "memory" in verdict.body:
        body["memory"] = verdict.body["memory"]
    return Health(503, body)


async def store_health(store: CaptureStore, *, timeout_s: float = STORE_HEALTH_TIMEOUT_S) -> Health:
    """200 `{"status": "ok"}` when the store answers its ping in time, else 503 saying why.

    A store with a memory limit adds `memory`, and is 503 `memory_full` or
    `captures_evicted` (with `error` and `store`) when its memory says so. A
    cluster adds `shards`, and is 503 `shard_unwritable` while a primary has
    fewer connected replicas than `min_replicas_acked` (beside `memory_full`
    too: writes to that shard fail either way).

    503 body: `{"status": "unhealthy", "store": kind, "error": ...}`; a redis
    store adds `"redis": {"reachable": false, "node": "host:port", "error": ...}`,
    naming the node that did not answer (of a cluster: the first primary down).
    """
    node: str | None = None
    try:
        memory, shards = await asyncio.wait_for(_probe(store), timeout=timeout_s)
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
        verdict = _HEALTHY if memory is None else _memory_verdict(store, memory)
        return _with_figures(store, _shard_verdict(store, verdict, shards))
    if node is None:
        node = _node(store)
        if node is None:
            return Health(503, {"status": "unhealthy", "store": store.kind, "error": error})
        error = f"redis node {node}: {error}"
    redis = {"reachable": False, "node": node, "error": error}
    body = {"status": "unhealthy", "store": store.kind, "error": error, "redis": redis}
    return _with_figures(store, Health(503, body), down=node)
