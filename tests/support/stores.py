"""Reading a store's state from test code of either colour (sync or async)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from token_finalizer.sources._state import CaptureState
from token_finalizer.sources.base import CaptureStore, SweepReport, SweepRules, SweptCapture

__all__ = ["run_sync", "stored_state", "sweep", "swept_captures"]

_T = TypeVar("_T")


def run_sync(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Run `coroutine` to completion from synchronous code, inside a running loop or not.

    Inside a running loop it runs on a loop of its own in another thread, so
    it suits stores whose clients are not bound to a loop (memory, file).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def stored_state(store: CaptureStore, rollout_id: str) -> CaptureState | None:
    """`store.admin.status(rollout_id)`: the rollout's stored state, or None."""
    return run_sync(store.admin.status(rollout_id))


async def swept_captures(
    store: CaptureStore,
    *,
    retired_older_than: float,
    abandoned_older_than: float | None = None,
    empty_older_than: float | None = None,
    dry_run: bool = False,
    now: float | None = None,
) -> list[SweptCapture]:
    """The captures one sweep of `store` by these rules removed (or would remove)."""
    return list(
        (
            await sweep(
                store, retired_older_than, abandoned_older_than, empty_older_than, dry_run, now
            )
        ).captures
    )


async def sweep(
    store: CaptureStore,
    retired_older_than: float,
    abandoned_older_than: float | None = None,
    empty_older_than: float | None = None,
    dry_run: bool = False,
    now: float | None = None,
) -> SweepReport:
    """One sweep of `store` by these rules: its whole report."""
    rules = SweepRules(retired_older_than, abandoned_older_than, empty_older_than)
    return await store.admin.sweep(rules, dry_run=dry_run, now=now)
