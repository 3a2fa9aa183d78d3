"""The finalizer's start-up check of its Redis servers: each is usable as configured.

`token-finalizer serve` runs it before the port opens and exits 2 with its
one line per refusal:

- a `redis` source, or the shared guard's `guard.redis`, not marked
  `cluster: true` whose server is a Redis Cluster node (`cluster_enabled:1`):
  it serves only that node's slots, so every other rollout would answer 503
  "retry" for good, and the guard would count nothing (issue 29);
- a `redis` source whose Redis has a `maxmemory-policy` other than
  `noeviction` and that does not say `allow_eviction: true`
  (docs/capacity.md#eviction).

A server out of reach at start is not held against the start (/ready says
so); a source's /ready reports `eviction_policy` once it answers.
"""

from __future__ import annotations

import logging

from token_finalizer.core.errors import CaptureError, ClusterModeRefused, EvictionPolicyRefused
from token_finalizer.service.guard_setup import open_guard
from token_finalizer.settings import Settings
from token_finalizer.sources import open_source

__all__ = ["needs_start_check", "start_refusals"]

logger = logging.getLogger(__name__)


def needs_start_check(settings: Settings) -> bool:
    """Whether any Redis is configured: a `redis` source, or a shared guard that counts."""
    shared_guard = settings.guard.redis is not None
    guarded = settings.token_id_capture.max_mask_fraction is not None
    redis_source = any(source.kind == "redis" for source in settings.sources.values())
    return redis_source or (shared_guard and guarded)


async def start_refusals(settings: Settings) -> list[str]:
    """One line per redis source or shared guard refused at start (see the module)."""
    return [*await _refused_sources(settings), *await _refused_guard(settings)]


async def _refused_sources(settings: Settings) -> list[str]:
    from token_finalizer.sources.redis import RedisTokenStore

    refused: list[str] = []
    for name, config in sorted(settings.sources.items()):
        if config.kind != "redis":
            continue
        store = open_source(config.kind, **config.open_options())
        try:
            if isinstance(store, RedisTokenStore):
                await store.check_cluster_mode()
                await store.refuse_eviction()
        except (ClusterModeRefused, EvictionPolicyRefused) as exc:
            refused.append(f"source {name!r}: {exc}")
        except CaptureError as exc:
            logger.warning("source %s: not checked at start: %s", name, exc)
        finally:
            await store.close()
    return refused


async def _refused_guard(settings: Settings) -> list[str]:
    from token_finalizer.service.redis_guard import RedisMaskFractionGuard

    guard = open_guard(settings)
    try:
        if isinstance(guard, RedisMaskFractionGuard):
            await guard.check_cluster_mode()
    except ClusterModeRefused as exc:
        return [f"guard.redis: {exc}"]
    except CaptureError as exc:
        logger.warning("guard.redis: not checked at start: %s", exc)
    finally:
        await guard.aclose()
    return []
