"""LoopPools: one pool per running event loop, opened there, closed with its loop."""

from __future__ import annotations

import asyncio
import threading

from token_finalizer_client._exchange import AnswerLimits, Reply
from token_finalizer_client._loop_pools import LoopPools
from token_finalizer_client._wire import WireRequest


class FakePool:
    """An AsyncPool that records the loop it was opened in and how it ended."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.closed_on: asyncio.AbstractEventLoop | None = None
        self.forgotten = False
        self.closed = threading.Event()

    async def exchange(
        self, request: WireRequest, limits: AnswerLimits, call_deadline: float | None
    ) -> Reply:
        raise NotImplementedError

    async def aclose(self) -> None:
        self.closed_on = asyncio.get_running_loop()
        self.closed.set()

    def forget(self) -> None:
        self.forgotten = True


def make_pools() -> tuple[LoopPools, list[FakePool]]:
    opened: list[FakePool] = []

    def open_pool() -> FakePool:
        pool = FakePool()
        opened.append(pool)
        return pool

    return LoopPools(open_pool), opened


async def current_twice(pools: LoopPools) -> tuple[object, object]:
    return pools.current(), pools.current()


def test_one_loop_gets_one_pool() -> None:
    """Two uses inside one loop share the pool opened by the first."""
    pools, opened = make_pools()
    first, second = asyncio.run(current_twice(pools))
    assert first is second and len(opened) == 1


def test_each_loop_gets_its_own_pool_opened_in_it() -> None:
    """Each `asyncio.run` opens its own pool, inside its own loop."""
    pools, opened = make_pools()
    for _ in range(3):
        asyncio.run(current_twice(pools))
    assert len(opened) == 3 and len({id(pool.loop) for pool in opened}) == 3


def test_a_pool_closes_on_its_loop_when_asyncio_run_ends() -> None:
    """`asyncio.run` closes the loop's pool on that loop before closing the loop."""
    pools, opened = make_pools()
    asyncio.run(current_twice(pools))
    assert opened[0].closed_on is opened[0].loop


def test_a_pool_of_a_hand_closed_loop_is_forgotten_at_the_next_use() -> None:
    """A loop closed without shutting its generators down leaves a pool that is later forgotten."""
    pools, opened = make_pools()
    loop = asyncio.new_event_loop()
    loop.run_until_complete(current_twice(pools))
    loop.close()
    asyncio.run(current_twice(pools))
    assert opened[0].forgotten and opened[0].closed_on is None


def test_aclose_closes_the_running_loops_pool() -> None:
    """`aclose` closes the running loop's pool there and forgets no live pool."""
    pools, opened = make_pools()

    async def use_then_close() -> None:
        pools.current()
        await pools.aclose()
        assert opened[0].closed_on is asyncio.get_running_loop()

    asyncio.run(use_then_close())
    assert pools.open_loops() == 0 and not opened[0].forgotten


def test_aclose_hands_another_threads_pool_to_its_loop() -> None:
    """A pool of a loop running in another thread is closed on that loop, not the caller's."""
    pools, opened = make_pools()
    used, release = threading.Event(), threading.Event()

    async def other_thread() -> None:
        pools.current()
        used.set()
        # Kept running (its loop free to run the handed-over close) until released.
        await asyncio.to_thread(release.wait, 10)

    thread = threading.Thread(target=asyncio.run, args=(other_thread(),))
    thread.start()
    used.wait(10)

    async def close_here() -> None:
        await pools.aclose()

    asyncio.run(close_here())
    closed_while_running = opened[0].closed.wait(10)  # before that loop ends
    release.set()
    thread.join(10)
    assert closed_while_running and opened[0].closed_on is opened[0].loop
