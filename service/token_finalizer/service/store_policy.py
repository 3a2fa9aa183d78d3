"""The finalizer's start-up check of its redis sources: each is usable as configured.

`token-finalizer serve` runs it before the port opens and exits 2 with its
one line per refused source:

- a source not marked `cluster: true` whose server is a Redis Cluster node
  (`cluster_enabled:1`): it would serve only that node's slots, and every
  other rollout would answer 503 "retry" for good (issue 29);
- a source whose Redis has a `maxmemory-policy` other than `noeviction` and
  that does not say `allow_eviction: true` (docs/capacity.md#eviction).

A source out of reach at start is not held against the start (its /ready
says so); its /ready reports `eviction_policy` once it answers.
"""

from __future__ import annotations

import logging

from token_finalizer.core.errors import CaptureError, ClusterModeRefused, EvictionPolicyRefused
from token_finalizer.settings import Settings
from token_finalizer.sources import open_source

__all__ = ["refused_sources"]

logger = logging.getLogger(__name__)


async def refused_sources(settings: Settings) -> list[str]:
    """One line per redis source that is a cluster node given as one Redis, or may evict keys."""
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
