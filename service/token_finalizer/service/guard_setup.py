"""Which mask-fraction guard a service runs, from its settings (docs/configuration.md#guard).

Apart from `guard` so that neither guard module imports the other: the
shared one (`redis_guard`) builds on `guard`'s counting rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from token_finalizer.service.guard import MaskFractionGuard, RunGuard

if TYPE_CHECKING:
    from token_finalizer.service.metrics import ServiceMetrics
    from token_finalizer.settings import Settings

__all__ = ["open_guard"]


def open_guard(settings: Settings, metrics: ServiceMetrics | None = None) -> RunGuard:
    """The guard the settings ask for: shared through Redis with `guard.redis`, else in-process.

    Without `max_mask_fraction` the guard is off, and no Redis connection is made.
    Without `metrics` (the start-up check) the shared guard counts no failures.
    """
    capture = settings.token_id_capture
    shared = settings.guard
    if shared.redis is None or capture.max_mask_fraction is None:
        return MaskFractionGuard(capture.max_mask_fraction, capture.mask_fraction_min_samples)
    # Imported here: only a configured shared guard loads redis-py.
    from token_finalizer.service.redis_guard import RedisMaskFractionGuard

    return RedisMaskFractionGuard(
        urls=shared.redis.seeds,
        cluster=shared.redis.cluster,
        min_replicas_acked=shared.redis.min_replicas_acked,
        max_mask_fraction=capture.max_mask_fraction,
        min_samples=capture.mask_fraction_min_samples,
        key_prefix=shared.key_prefix,
        run_ttl_s=shared.run_ttl_s,
        timeout_s=shared.timeout_s,
        metrics=metrics,
    )
