"""GET /health of the capture store: the server answers, and so does the store behind it.

A store server whose Redis is down (or whose directory is gone) must not look
healthy: the finalizer's `/ready` probes this route for each `http` source,
and load balancers and compose healthchecks read it too. The backend is
pinged with a deadline below the finalizer's own probe budget, so the
finalizer sees this verdict and its error, not a timeout of its own.
See docs/store-protocol.md#health.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from token_finalizer._constants import STORE_HEALTH_TIMEOUT_S
from token_finalizer.core.errors import CaptureError, StoreNodeUnreachable, describe_exception
from token_finalizer.core.redaction import redact
from token_finalizer.sources.base import CaptureStore

__all__ = ["Health", "store_health"]


@dataclass(frozen=True, slots=True)
class Health:
    """The status code and body of one /health answer."""

    status_code: int
    body: dict[str, Any]


_HEALTHY = Health(200, {"status": "ok"})


def _node(store: CaptureStore) -> str | None:
    """The Redis node a redis store talks to; None for other stores (redis-py stays unloaded)."""
    if store.kind != "redis":
        return None
    from token_finalizer.sources.redis import RedisTokenStore

    return store.node if isinstance(store, RedisTokenStore) else None


async def store_health(store: CaptureStore, *, timeout_s: float = STORE_HEALTH_TIMEOUT_S) -> Health:
    """200 `{"status": "ok"}` when the store answers its ping in time, else 503 saying why.

    503 body: `{"status": "unhealthy", "store": kind, "error": ...}`; a redis
    store adds `"redis": {"reachable": false, "node": "host:port", "error": ...}`,
    naming the node that did not answer (of a cluster: the first primary down).
    """
    node: str | None = None
    try:
        await asyncio.wait_for(store.ping(), timeout=timeout_s)
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
        return _HEALTHY
    if node is None:
        node = _node(store)
        if node is None:
            return Health(503, {"status": "unhealthy", "store": store.kind, "error": error})
        error = f"redis node {node}: {error}"
    redis = {"reachable": False, "node": node, "error": error}
    return Health(503, {"status": "unhealthy", "store": store.kind, "error": error, "redis": redis})
