"""AsyncFinalizerClient.finalize_many / finalize_iter, and the ordered, bounded map under them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.client.conftest import capture_rollout
from tests.support.captures import record_for
from token_finalizer import FileTokenStore
from token_finalizer_client import AsyncFinalizerClient, BadRequestError, Finalized
from token_finalizer_client._constants import REORDER_WINDOW_FACTOR
from token_finalizer_client._ordered import ordered_map

pytestmark = pytest.mark.anyio


async def test_results_come_back_in_input_order(
    service_url: str, local_store: FileTokenStore
) -> None:
    """Rollouts of very different sizes, 4 at a time, come back in the order they were given."""
    sizes = [12, 1, 8, 1, 1, 6, 1, 3, 1, 1, 10, 1]
    ids = [
        await capture_rollout(local_store, calls=calls, new_tokens_per_turn=300) for calls in sizes
    ]
    async with AsyncFinalizerClient(service_url) as client:
        results = await client.finalize_many([record_for(i) for i in ids], concurrency=4)
    assert [result.rollout_id for result in results] == ids


async def test_finalize_many_hands_out_expanded_records(
    service_url: str, local_store: FileTokenStore
) -> None:
    """Batch results carry standard records: every prompt a list of ids, no context kept."""
    ids = [await capture_rollout(local_store, calls=3) for _ in range(3)]
    async with AsyncFinalizerClient(service_url) as client:
        results = await client.finalize_many([record_for(i) for i in ids], concurrency=2)
    for result in results:
        assert isinstance(result, Finalized)
        output = result.record["response"]["output"]
        prompts = [item["prompt_token_ids"] for item in output if "prompt_token_ids" in item]
        assert len(prompts) == 3 and all(isinstance(prompt, list) for prompt in prompts)
        assert "context_token_ids" not in result.to_answer()


async def test_on_result_sees_each_result_in_input_order(service_url: str) -> None:
    """on_result is called with (index, result) for every record, indexes ascending."""
    seen: list[tuple[int, str | None]] = []
    records = [record_for(f"absent-{n}") for n in range(6)]
    async with AsyncFinalizerClient(service_url) as client:
        await client.finalize_many(
            records, concurrency=3, on_result=lambda i, r: seen.append((i, r.rollout_id))
        )
    assert seen == [(n, f"absent-{n}") for n in range(6)]


async def test_first_error_raises_by_default(service_url: str) -> None:
    """A record the service refuses makes finalize_many raise its error."""
    records: list[Any] = [record_for("absent-a"), [1, 2], record_for("absent-b")]
    async with AsyncFinalizerClient(service_url) as client:
        with pytest.raises(BadRequestError):
            await client.finalize_many(records, concurrency=2)


async def test_return_exceptions_keeps_errors_in_place(service_url: str) -> None:
    """With return_exceptions each refused record's error sits at its own index."""
    records: list[Any] = [record_for("absent-a"), [1, 2], record_for("absent-b")]
    async with AsyncFinalizerClient(service_url) as client:
        results = await client.finalize_many(records, concurrency=2, return_exceptions=True)
    assert [type(result) for result in results] == [Finalized, BadRequestError, Finalized]


async def test_finalize_iter_streams_in_order(service_url: str) -> None:
    """finalize_iter yields Finalized objects one by one in input order."""
    records = (record_for(f"absent-{n}") for n in range(5))
    async with AsyncFinalizerClient(service_url) as client:
        ids = [result.rollout_id async for result in client.finalize_iter(records, concurrency=2)]
    assert ids == [f"absent-{n}" for n in range(5)]


async def test_ordered_map_reorders_out_of_order_completions() -> None:
    """Items finishing in reverse order are still yielded in input order."""

    async def slower_first(n: int) -> int:
        await asyncio.sleep(0.01 * (5 - n))
        return n

    results = [r async for r in ordered_map(slower_first, range(5), concurrency=5)]
    assert results == [0, 1, 2, 3, 4]


async def test_ordered_map_never_exceeds_its_concurrency() -> None:
    """No more than `concurrency` calls run at the same time."""
    running = 0
    peak = 0

    async def tracked(n: int) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.005)
        running -= 1
        return n

    results = [r async for r in ordered_map(tracked, range(30), concurrency=3)]
    assert (len(results), peak) == (30, 3)


async def test_ordered_map_reads_its_input_lazily() -> None:
    """Items are pulled only a bounded window ahead of what was handed out."""
    pulled = 0

    def counting() -> Iterator[int]:
        nonlocal pulled
        for n in range(1000):
            pulled += 1
            yield n

    async def echo(n: int) -> int:
        return n

    outcomes = ordered_map(echo, counting(), concurrency=2)
    async with contextlib.aclosing(outcomes):
        await anext(outcomes)
        assert pulled <= 2 * REORDER_WINDOW_FACTOR + 1


async def test_ordered_map_yields_captured_errors_in_place() -> None:
    """An exception of a `capture` class is yielded at its item's position."""

    async def odd_fails(n: int) -> int:
        if n % 2:
            raise KeyError(n)
        return n

    results = [
        r async for r in ordered_map(odd_fails, range(4), concurrency=2, capture=(KeyError,))
    ]
    assert [type(r) for r in results] == [int, KeyError, int, KeyError]


async def test_ordered_map_cancels_the_rest_on_an_uncaptured_error() -> None:
    """An uncaptured error propagates and the calls still running are cancelled."""
    cancelled: list[int] = []

    async def first_fails(n: int) -> int:
        if n == 0:
            raise RuntimeError("first")
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(n)
            raise
        return n

    with pytest.raises(RuntimeError, match="first"):
        async for _ in ordered_map(first_fails, range(4), concurrency=4):
            pass
    assert sorted(cancelled) == [1, 2, 3]


async def test_ordered_map_refuses_zero_concurrency() -> None:
    """concurrency below 1 is a ValueError."""
    with pytest.raises(ValueError, match="concurrency"):
        async for _ in ordered_map(asyncio.sleep, [0], concurrency=0):
            pass


async def test_on_result_may_be_a_coroutine_function(service_url: str) -> None:
    """An async on_result is awaited for each result before the next one is handed out."""
    seen: list[int] = []

    async def record_index(index: int, result: Finalized | Exception) -> None:
        await asyncio.sleep(0)
        seen.append(index)

    async with AsyncFinalizerClient(service_url) as client:
        await client.finalize_many(
            [record_for(f"absent-{n}") for n in range(4)], on_result=record_index
        )
    assert seen == [0, 1, 2, 3]
