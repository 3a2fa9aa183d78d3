"""One asyncio connection pool per running event loop, opened there and closed with it.

An asyncio pool (aiohttp's session, httpx's `AsyncClient`) belongs to the
loop it first ran in: used from another it fails ("attached to a different
loop", "Event loop is closed"). A client object, though, is built once and
then called from wherever its caller runs: `asyncio.run` per call, a
Starlette `TestClient` portal (its own loop in a thread), two threads at once
(docs/architecture.md#event-loops). So each object keeps a `LoopPools`: the
pool of the running loop, opened lazily on its first use there.

A pool must also close with its loop, or aiohttp logs "Unclosed client
session" when it is collected. Each pool is therefore guarded by a suspended
async generator of that loop: `asyncio.run` (and every `asyncio.Runner`,
anyio's included) closes the loop's async generators before closing the
loop, and the guard's `finally` closes the pool there, on its own loop. A
loop closed without that step (a hand-made loop) leaves its pool behind: it
is forgotten at the next use without awaiting anything on the dead loop
(`AsyncPool.forget`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from token_finalizer_client._exchange import AsyncPool

__all__ = ["LoopPools"]


async def _guard(pool: AsyncPool) -> AsyncGenerator[None, None]:
    """Suspended until its loop shuts its async generators down; then closes `pool`."""
    try:
        yield
    finally:
        await pool.aclose()


async def _close_guard(guard: AsyncGenerator[None, None]) -> None:
    await guard.aclose()


@dataclass(slots=True)
class _Entry:
    pool: AsyncPool
    guard: AsyncGenerator[None, None]


def _start(guard: AsyncGenerator[None, None]) -> None:
    """Run `guard` to its `yield` now, inside the running loop: the loop then owns it.

    The first step registers the generator with the running loop (its
    first-iteration hook); it never suspends, so it needs no await.
    """
    step = guard.__anext__()
    with contextlib.suppress(StopIteration):
        step.send(None)


class LoopPools:
    """The asyncio pools of one client object, one per event loop it is used from."""

    def __init__(self, open_pool: Callable[[], AsyncPool]) -> None:
        self._open = open_pool
        self._lock = threading.Lock()
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Entry] = (
            weakref.WeakKeyDictionary()
        )

    def current(self) -> AsyncPool:
        """The running loop's pool, opened now if this loop has none; call inside a loop."""
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._pools.get(loop)
            if entry is not None:
                return entry.pool
            stale = self._take_closed()
            pool = self._open()
            entry = _Entry(pool, _guard(pool))
            _start(entry.guard)
            self._pools[loop] = entry
        for old in stale:
            old.pool.forget()
        return entry.pool

    def _take_closed(self) -> list[_Entry]:
        """Remove and return the entries whose loop has closed (the lock is held)."""
        closed = [loop for loop in self._pools if loop.is_closed()]
        return [self._pools.pop(loop) for loop in closed]

    def open_loops(self) -> int:
        """How many loops hold a pool of this object right now (closed loops not counted)."""
        with self._lock:
            return sum(1 for loop in self._pools if not loop.is_closed())

    async def aclose(self) -> None:
        """Close the running loop's pool; hand every other live loop's pool to its loop.

        A pool whose loop has closed is forgotten. Safe to call twice.
        """
        running = asyncio.get_running_loop()
        with self._lock:
            entries = list(self._pools.items())
            self._pools.clear()
        mine: _Entry | None = None
        for loop, entry in entries:
            if loop is running:
                mine = entry
            elif loop.is_closed():
                entry.pool.forget()
            else:
                # Another thread's loop: its pool closes there, on its own loop.
                with contextlib.suppress(RuntimeError):  # it closed meanwhile
                    asyncio.run_coroutine_threadsafe(_close_guard(entry.guard), loop)
        if mine is not None:
            await mine.guard.aclose()
