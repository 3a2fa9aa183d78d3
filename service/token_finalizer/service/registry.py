"""The configured sources of one app: opened once at start-up, shared by every request.

Each source is wrapped so its calls are timed and its exceptions counted in
the metrics; the delivery functions turn those exceptions into masked builds
or `retired: false`, so without the wrapper a dead store would be invisible.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar

from token_finalizer._constants import READY_PING_TIMEOUT_S
from token_finalizer.core.entries import Snapshot
from token_finalizer.core.errors import StoreNodeUnreachable, describe_exception
from token_finalizer.core.protocols import AddressedSource, TokenSource
from token_finalizer.core.redaction import redact
from token_finalizer.service.errors import UnknownSource
from token_finalizer.service.metrics import ServiceMetrics
from token_finalizer.settings import Settings
from token_finalizer.sources import open_source, redis_store_of
from token_finalizer.sources.base import CaptureSource, MemoryHealth, StagedExtras
from token_finalizer.tracing import ROLLOUT_ID, SOURCE, child_span

# A source's status while one of its shards cannot take writes
# (docs/finalizer-api.md#health-readiness-metrics).
SHARD_UNWRITABLE = "shard_unwritable"
# Statuses that already make the process unready, which the shards' do not replace.
UNREADY_MEMORY_STATUSES = frozenset({"captures_evicted", "eviction_policy"})

__all__ = [
    "SHARD_UNWRITABLE",
    "UNREADY_MEMORY_STATUSES",
    "InstrumentedSource",
    "SourceRegistry",
    "as_capture_source",
]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


def _span_attributes(source: str, rollout_id: str | None) -> dict[str, str]:
    if rollout_id is None:
        return {SOURCE: source}
    return {SOURCE: source, ROLLOUT_ID: rollout_id}


class _Unprobed:
    """A TokenSource given in code without a reachability probe: it counts as reachable.

    The seed's TokenSource protocol has no `ping`; such a source is adapted
    once, where it is registered, instead of being probed for a method later.
    """

    def __init__(self, inner: TokenSource) -> None:
        self.inner = inner

    async def freeze(self, rollout_id: str) -> Snapshot:
        return await self.inner.freeze(rollout_id)

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        return await self.inner.drop(rollout_id, snapshot_id=snapshot_id, version=version)

    async def ping(self) -> None:
        """Nothing to probe: reachable."""

    async def memory_health(self) -> MemoryHealth | None:
        """Nothing to report."""
        return None

    async def close(self) -> None:
        await self.inner.close()

    async def fetch_extras(self, rollout_id: str, call_ids: Sequence[str]) -> StagedExtras:
        """A seed TokenSource holds no staged calls."""
        return {}


def as_capture_source(source: TokenSource | CaptureSource) -> CaptureSource:
    """`source` itself when it implements CaptureSource, else adapted to it (no probe)."""
    return source if isinstance(source, CaptureSource) else _Unprobed(source)


class InstrumentedSource:
    """A CaptureSource that records the latency and failures of the source it wraps."""

    def __init__(self, name: str, inner: CaptureSource, metrics: ServiceMetrics) -> None:
        self.name = name
        self.inner = inner
        self._metrics = metrics

    async def _timed(
        self, operation: str, call: Awaitable[_T], rollout_id: str | None = None
    ) -> _T:
        started = time.perf_counter()
        try:
            # A request's trace shows each call to its source (docs/tracing.md).
            with child_span(operation, _span_attributes(self.name, rollout_id)):
                return await call
        except Exception:
            self._metrics.source_errors.labels(self.name, operation).inc()
            raise
        finally:
            self._metrics.source_seconds.labels(self.name, operation).observe(
                time.perf_counter() - started
            )

    async def freeze(self, rollout_id: str) -> Snapshot:
        """Freeze through the wrapped source."""
        return await self._timed("freeze", self.inner.freeze(rollout_id), rollout_id)

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        """Drop through the wrapped source."""
        dropping = self.inner.drop(rollout_id, snapshot_id=snapshot_id, version=version)
        return await self._timed("drop", dropping, rollout_id)

    async def ping(self) -> None:
        """Reachability of the wrapped source."""
        await self._timed("ping", self.inner.ping())

    async def memory_health(self) -> MemoryHealth | None:
        """The wrapped source's memory (docs/capacity.md)."""
        return await self.inner.memory_health()

    @property
    def store_option(self) -> str:
        """The wrapped source's `token-finalizer store` option ('' when it has none), for hints."""
        inner = self.inner
        return inner.store_option if isinstance(inner, AddressedSource) else ""

    async def unwritable_shards(self) -> tuple[list[dict[str, Any]], str | None]:
        """A redis store with `min_replicas_acked`: its primaries, and why some cannot take
        writes (None when every one can); ([], None) for any other source. Each primary's
        verdict is also the `source_shard_writable` gauge."""
        redis = redis_store_of(self.inner)
        if redis is None or not redis.min_replicas_acked:
            return [], None
        from token_finalizer.sources.redis import unwritable_reason  # loaded by now

        shards = await redis.shard_health()
        for shard in shards:
            writable = self._metrics.source_shard_writable.labels(self.name, shard.node)
            writable.set(1 if shard.writable else 0)
        return [shard.to_dict() for shard in shards], unwritable_reason(shards)

    async def fetch_extras(self, rollout_id: str, call_ids: Sequence[str]) -> StagedExtras:
        """The extras of staged calls, through the wrapped source."""
        return await self._timed(
            "fetch_extras", self.inner.fetch_extras(rollout_id, call_ids), rollout_id
        )

    async def close(self) -> None:
        """Close the wrapped source."""
        await self.inner.close()


class SourceRegistry:
    """Name -> source, plus the default; unknown names are refused, never created."""

    def __init__(
        self,
        sources: Mapping[str, InstrumentedSource],
        default: str,
        *,
        owned: frozenset[str] = frozenset(),
    ) -> None:
        self._sources = dict(sources)
        self.default = default
        self._owned = owned

    @classmethod
    def open(
        cls,
        settings: Settings,
        metrics: ServiceMetrics,
        provided: Mapping[str, TokenSource] | None = None,
    ) -> SourceRegistry:
        """Open every configured source not `provided` in code; provided ones stay the caller's."""
        provided = dict(provided or {})
        sources: dict[str, InstrumentedSource] = {}
        owned = set()
        for name, config in settings.sources.items():
            if name in provided:
                continue
            sources[name] = InstrumentedSource(
                name, open_source(config.kind, **config.open_options()), metrics
            )
            owned.add(name)
        for name, source in provided.items():
            sources[name] = InstrumentedSource(name, as_capture_source(source), metrics)
        return cls(sources, settings.default_source, owned=frozenset(owned))

    @property
    def names(self) -> list[str]:
        """Every configured source name, sorted."""
        return sorted(self._sources)

    def resolve(self, name: str | None) -> InstrumentedSource:
        """The named source (the default for None); UnknownSource for an unknown name."""
        key = self.default if name is None else name
        source = self._sources.get(key)
        if source is None:
            raise UnknownSource(
                f"unknown source {key!r}; configured sources: {', '.join(self.names)}"
            )
        return source

    async def reachability(self) -> dict[str, dict[str, Any]]:
        """Ping every source concurrently: name -> {"reachable": bool, "error"?: str}.

        A store with several servers (a Redis Cluster) names the node that is down.
        A store with a memory limit adds `memory`, and `status` (`memory_full`,
        `captures_evicted`, `eviction_policy`) when it is not healthy
        (docs/capacity.md). A redis store with `min_replicas_acked` adds
        `shards`, and `status` `shard_unwritable` with the `error` naming each
        primary short of replicas and the replicas it lacks.
        """

        async def checked(
            source: InstrumentedSource,
        ) -> tuple[MemoryHealth | None, tuple[list[dict[str, Any]], str | None]]:
            await source.ping()
            return await source.memory_health(), await source.unwritable_shards()

        async def probe(source: InstrumentedSource) -> dict[str, Any]:
            try:
                memory, (shards, stuck) = await asyncio.wait_for(
                    checked(source), timeout=READY_PING_TIMEOUT_S
                )
            except TimeoutError:
                return {"reachable": False, "error": f"no answer in {READY_PING_TIMEOUT_S}s"}
            except StoreNodeUnreachable as exc:
                # Its message names the node that is down: "redis node host:port: ...".
                return {"reachable": False, "error": redact(str(exc))}
            except Exception as exc:
                return {"reachable": False, "error": redact(describe_exception(exc))}
            answer: dict[str, Any] = {"reachable": True}
            if memory is not None:
                answer["memory"] = memory.memory
                if memory.status is not None:
                    answer["status"] = memory.status
            if shards:
                answer["shards"] = shards
            if stuck is not None and answer.get("status") not in UNREADY_MEMORY_STATUSES:
                # A shard short of replicas: every write (freeze, drop) to its slots fails.
                answer["status"], answer["error"] = SHARD_UNWRITABLE, stuck
            return answer

        names = self.names
        results = await asyncio.gather(*(probe(self._sources[n]) for n in names))
        return dict(zip(names, results, strict=True))

    async def close(self) -> None:
        """Close the sources this registry opened (provided ones belong to their caller)."""
        for name in self._owned:
            try:
                await self._sources[name].close()
            except Exception:
                logger.exception("closing source %s failed", name)
