"""Everything one app shares across requests, opened once and closed once.

`ServiceState` owns what it opened: its configured sources and its guard's
connections. It is an async context manager, so whoever runs the service
(the app's lifespan, the batch command's in-process target) writes

    async with ServiceState.open(settings) as state:
        ...

or calls `aclose()` itself, and nothing else closes a part of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType

from token_finalizer._constants import FINALIZE_CONCURRENCY
from token_finalizer.core.protocols import TokenSource
from token_finalizer.service.guard import RunGuard
from token_finalizer.service.guard_setup import open_guard
from token_finalizer.service.metrics import ServiceMetrics
from token_finalizer.service.registry import SourceRegistry
from token_finalizer.service.tickets import TicketSigner
from token_finalizer.settings import Settings

__all__ = ["ServiceState"]


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
    # slots, never those of a healthy one (docs/finalizer-api.md#concurrency-and-large-rollouts).
    _slots: dict[str, asyncio.Semaphore] = field(default_factory=dict)
    _closed: bool = field(default=False)

    @classmethod
    def open(
        cls,
        settings: Settings,
        *,
        sources: Mapping[str, TokenSource] | None = None,
        metrics: ServiceMetrics | None = None,
    ) -> ServiceState:
        """Open every configured source (plus `sources` given in code) with fresh counts.

        Sources given in code stay their caller's: closing the state leaves them open.
        """
        metrics = ServiceMetrics() if metrics is None else metrics
        # The guard first: until its first command it holds no connection, so
        # a source that fails to open leaves nothing behind to close.
        guard = open_guard(settings, metrics)
        return cls(
            settings=settings,
            sources=SourceRegistry.open(settings, metrics, sources),
            metrics=metrics,
            guard=guard,
            tickets=TicketSigner.from_config(settings.retire.key),
        )

    async def __aenter__(self) -> ServiceState:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the sources this state opened, then the guard's connections; idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.sources.close()
        finally:
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
