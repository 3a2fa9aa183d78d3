"""Everything one app shares across requests, created in its lifespan."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

from token_finalizer._constants import FINALIZE_CONCURRENCY
from token_finalizer.core.protocols import TokenSource
from token_finalizer.service.guard import RunGuard, open_guard
from token_finalizer.service.metrics import ServiceMetrics
from token_finalizer.service.registry import SourceRegistry
from token_finalizer.service.tickets import TicketSigner
from token_finalizer.settings import Settings

__all__ = ["ServiceState"]


class _StateSources(SourceRegistry):
    """The state's source registry, which closes the state's guard along with its sources.

    Whoever shuts a state down (the app's lifespan, the batch command's
    in-process target) closes `state.sources`; closing the shared guard's
    Redis connections there too means none of them has to know about it.
    """

    guard: RunGuard | None = None

    async def close(self) -> None:
        """Close the sources this registry opened, then the guard (both idempotent)."""
        try:
            await super().close()
        finally:
            if self.guard is not None:
                await self.guard.aclose()


@dataclass
class ServiceState:
    """Settings, open sources, metrics, guard counts, and whether the process is draining."""

    settings: Settings
    sources: SourceRegistry
    metrics: ServiceMetrics
    guard: RunGuard
    tickets: TicketSigner
    draining: bool = field(default=False)
    # Finalizes running at once, per source: a slow store holds only its own
    # slots, never those of a healthy one (docs/architecture.md#concurrency).
    _slots: dict[str, asyncio.Semaphore] = field(default_factory=dict)

    @classmethod
    def open(
        cls,
        settings: Settings,
        *,
        sources: Mapping[str, TokenSource] | None = None,
        metrics: ServiceMetrics | None = None,
    ) -> ServiceState:
        """Open every configured source (plus `sources` given in code) with fresh counts."""
        metrics = ServiceMetrics() if metrics is None else metrics
        guard = open_guard(settings, metrics)
        registry = _StateSources.open(settings, metrics, sources)
        assert isinstance(registry, _StateSources)
        registry.guard = guard
        return cls(
            settings=settings,
            sources=registry,
            metrics=metrics,
            guard=guard,
            tickets=TicketSigner.from_config(settings.retire.key),
        )

    async def close(self) -> None:
        """Close the sources this state opened, and the guard's connections."""
        await self.sources.close()
        await self.guard.aclose()

    def finalize_slots(self, source_name: str) -> asyncio.Semaphore:
        """The semaphore bounding concurrent finalizes through one source."""
        slots = self._slots.get(source_name)
        if slots is None:
            slots = self._slots[source_name] = asyncio.Semaphore(FINALIZE_CONCURRENCY)
        return slots

    def begin_draining(self) -> None:
        """From now on /ready answers 503: the process is shutting down."""
        self.draining = True
