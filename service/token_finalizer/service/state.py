"""Everything one app shares across requests, created in its lifespan."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

from token_finalizer._constants import FINALIZE_CONCURRENCY
from token_finalizer.core.protocols import TokenSource
from token_finalizer.service.guard import MaskFractionGuard
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
    guard: MaskFractionGuard
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
        capture = settings.token_id_capture
        return cls(
            settings=settings,
            sources=SourceRegistry.open(settings, metrics, sources),
            metrics=metrics,
            guard=MaskFractionGuard(capture.max_mask_fraction, capture.mask_fraction_min_samples),
            tickets=TicketSigner.from_config(settings.retire.key),
        )

    def finalize_slots(self, source_name: str) -> asyncio.Semaphore:
        """The semaphore bounding concurrent finalizes through one source."""
        slots = self._slots.get(source_name)
        if slots is None:
            slots = self._slots[source_name] = asyncio.Semaphore(FINALIZE_CONCURRENCY)
        return slots

    def begin_draining(self) -> None:
        """From now on /ready answers 503: the process is shutting down."""
        self.draining = True
