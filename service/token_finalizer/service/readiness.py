"""GET /ready: can this process finalize right now?"""

from __future__ import annotations

from typing import Any

from token_finalizer.service.state import ServiceState

__all__ = ["readiness"]


async def readiness(state: ServiceState) -> tuple[int, dict[str, Any]]:
    """(status code, body): 503 while draining or when any configured source is unreachable."""
    sources = await state.sources.reachability()
    if state.draining:
        return 503, {
            "status": "draining",
            "error": "the service is shutting down",
            "sources": sources,
        }
    down = sorted(name for name, probe in sources.items() if not probe["reachable"])
    if down:
        return 503, {
            "status": "unavailable",
            "error": f"source(s) unreachable: {', '.join(down)}",
            "sources": sources,
        }
    return 200, {"status": "ready", "sources": sources}
