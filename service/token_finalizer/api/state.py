"""Everything one app shares across requests, created in its lifespan."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from token_finalizer._constants import FINALIZE_CONCURRENCY
from token_finalizer.api.guard import MaskFractionGuard
from token_finalizer.api.metrics import ServiceMetrics
from token_finalizer.api.registry import SourceRegistry
from token_finalizer.settings import Settings

__all__ = ["ServiceState"]


@dataclass
class ServiceState:
    """Settings, open sources, metrics, guard counts, and whether the process is draining."""

    settings: Settings
    sources: SourceRegistry
    metrics: ServiceMetrics
    guard: MaskFractionGuard
    draining: bool = field(default=False)
    finalize_slots: asyncio.Semaphore = field(
        default_factory=lambda: asyncio.Semaphore(FINALIZE_CONCURRENCY)
    )

    def begin_draining(self) -> None:
        """From now on /ready answers 503: the process is shutting down."""
        self.draining = True
