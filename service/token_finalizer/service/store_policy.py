"""The finalizer's start-up check of its redis sources: none may evict capture keys.

`token-finalizer serve` runs it before the port opens and exits 2 with its
one line per source when a source's Redis has a `maxmemory-policy` other than
`noeviction` and the source does not say `allow_eviction: true`. A source
out of reach at start is not held against the start (its /ready says so);
its /ready reports `eviction_policy` once it answers. See docs/capacity.md#eviction.
"""

from __future__ import annotations

import logging

from token_finalizer.core.errors import CaptureError, EvictionPolicyRefused
from token_finalizer.settings import Settings
from token_finalizer.sources import open_source

__all__ = ["evicting_sources"]

logger = logging.getLogger(__name__)


async def evicting_sources(settings: Settings) -> list[str]:
    """One line per redis source whose Redis may evict keys (and does not allow it)."""
    from token_finalizer.sources.redis import RedisTokenStore

    refused: list[str] = []
    for name, config in sorted(settings.sources.items()):
        if config.kind != "redis":
            continue
        store = open_source(config.kind, **config.open_options())
        try:
            if isinstance(store, RedisTokenStore):
                await store.refuse_eviction()
        except EvictionPolicyRefused as exc:
            refused.append(f"source {name!r}: {exc}")
        except CaptureError as exc:
            logger.warning("source %s: eviction policy not checked at start: %s", name, exc)
        finally:
            await store.close()
    return refused
