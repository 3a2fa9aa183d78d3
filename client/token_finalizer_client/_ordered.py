"""Bounded concurrency with results handed out in input order."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from typing import TypeVar

from token_finalizer_client._constants import REORDER_WINDOW_FACTOR

__all__ = ["ordered_map"]

T = TypeVar("T")
R = TypeVar("R")
E = TypeVar("E", bound=BaseException)


async def ordered_map(
    call: Callable[[T], Awaitable[R]],
    items: Iterable[T],
    *,
    concurrency: int,
    capture: tuple[type[E], ...] = (),
) -> AsyncGenerator[R | E, None]:
    """Yield `await call(item)` for each item, in input order, at most `concurrency` at once.

    `items` is read lazily: no more than `concurrency * REORDER_WINDOW_FACTOR`
    items are started ahead of the oldest unfinished one, which bounds memory
    on an endless input and when one slow item holds back the ones after it.
    An exception of a `capture` class is yielded in its item's place; any
    other stops the iteration and propagates. Leaving early cancels the calls
    still running (close the generator, e.g. with `contextlib.aclosing`).
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    window = concurrency * REORDER_WINDOW_FACTOR
    slots = asyncio.Semaphore(concurrency)

    async def bounded(item: T) -> R:
        async with slots:
            return await call(item)

    iterator = iter(items)
    pending: deque[asyncio.Task[R]] = deque()
    exhausted = False
    try:
        while True:
            while not exhausted and len(pending) < window:
                try:
                    item = next(iterator)
                except StopIteration:
                    exhausted = True
                    break
                pending.append(asyncio.create_task(bounded(item)))
            if not pending:
                return
            head = pending.popleft()
            try:
                outcome: R | E = await head
            except capture as exc:
                outcome = exc
            yield outcome
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
