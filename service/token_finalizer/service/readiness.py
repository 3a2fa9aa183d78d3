"""Can this process finalize right now? The verdict behind GET /ready.

A verdict, not an answer: the transport decides what status it becomes
(`api/routes.py`). See docs/finalizer-api.md#health-readiness-metrics.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal

from token_finalizer.service.registry import SHARD_UNWRITABLE, UNREADY_MEMORY_STATUSES
from token_finalizer.service.state import ServiceState

# A source's memory status in UNREADY_MEMORY_STATUSES makes the process unready: its
# captures cannot be trusted (keys evicted, or a policy that evicts them). `memory_full`
# does not: the finalizer's freezes and retires are what free the store
# (docs/capacity.md). A shard that cannot take writes does (SHARD_UNWRITABLE): freezes
# and retires of its rollouts fail until its replicas are back.
__all__ = ["SHARD_UNWRITABLE", "UNREADY_MEMORY_STATUSES", "Readiness", "readiness"]


@dataclass(frozen=True, slots=True)
class Readiness:
    """Whether the process is ready, why not, and what each source's ping said."""

    status: Literal["ready", "draining", "unavailable"]
    sources: dict[str, dict[str, Any]]
    error: str | None = None
    # The shared guard's Redis, when there is one: reported, never a reason to fail.
    guard: dict[str, Any] | None = None

    @property
    def ready(self) -> bool:
        """True only when not draining and every configured source answered."""
        return self.status == "ready"

    def to_dict(self) -> dict[str, Any]:
        """The body of the verdict: status, the error when not ready, and the sources."""
        body: dict[str, Any] = {"status": self.status}
        if self.error is not None:
            body["error"] = self.error
        body["sources"] = self.sources
        if self.guard is not None:
            body["guard"] = self.guard
        return body


async def readiness(state: ServiceState) -> Readiness:
    """Not ready while draining or when any configured source is unreachable, or its
    Redis evicted keys (or may); a source above its memory mark is reported, still ready.

    The shared guard's Redis is probed and reported, but never makes the
    process unready: the guard fails open by design.
    """
    sources, guard = await asyncio.gather(state.sources.reachability(), state.guard.probe())
    if state.draining:
        return Readiness("draining", sources, "the service is shutting down", guard)
    down = sorted(name for name, probe in sources.items() if not probe["reachable"])
    if down:
        error = f"source(s) unreachable: {', '.join(down)}"
        return Readiness("unavailable", sources, error, guard)
    untrusted = sorted(
        name for name, probe in sources.items() if probe.get("status") in UNREADY_MEMORY_STATUSES
    )
    if untrusted:
        reasons = ", ".join(f"{name} ({sources[name]['status']})" for name in untrusted)
        return Readiness("unavailable", sources, f"source(s) may lose captures: {reasons}", guard)
    stuck = sorted(
        name for name, probe in sources.items() if probe.get("status") == SHARD_UNWRITABLE
    )
    if stuck:
        reasons = "; ".join(f"{name}: {sources[name]['error']}" for name in stuck)
        return Readiness("unavailable", sources, f"source(s) cannot take writes: {reasons}", guard)
    return Readiness("ready", sources, guard=guard)
