"""The redis store on a Redis with little memory: eviction policies, the mark, OOM.

Every test runs its own `redis-server` with a small `maxmemory` (docs/capacity.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis

from tests.support.redis_memory import call_entry, fill, limited_redis
from tests.support.redis_processes import RedisProcess, needs_redis_server, plain_client
from token_finalizer.core.errors import EvictionPolicyRefused, StoreMemoryFull
from token_finalizer.sources.base import SweepRules
from token_finalizer.sources.redis import RedisTokenStore
from token_finalizer.sources.redis._scripts import ALLOWED_UNDER_OOM, script_source

pytestmark = [pytest.mark.anyio, needs_redis_server]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisProcess]:
    with limited_redis(tmp_path) as process:
        yield process


@pytest.fixture
async def store(server: RedisProcess) -> AsyncIterator[RedisTokenStore]:
    opened = RedisTokenStore(server.url, key_prefix="m:")
    yield opened
    await opened.close()


@pytest.fixture
async def unmarked(server: RedisProcess) -> AsyncIterator[RedisTokenStore]:
    """A store without a mark: only Redis's own OOM refuses its writes."""
    opened = RedisTokenStore(server.url, key_prefix="m:", memory_high_water=None)
    yield opened
    await opened.close()


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru", "volatile-ttl", "allkeys-lfu"])
async def test_an_evicting_policy_is_refused_naming_it_and_the_fix(
    tmp_path: Path, policy: str
) -> None:
    """Any maxmemory-policy but noeviction is refused; the message names it and the fix."""
    with limited_redis(tmp_path, policy=policy) as server:
        store = RedisTokenStore(server.url)
        try:
            with pytest.raises(EvictionPolicyRefused) as refused:
                await store.refuse_eviction()
        finally:
            await store.close()
    assert policy in str(refused.value)
    assert "CONFIG SET maxmemory-policy noeviction" in str(refused.value)


async def test_allow_eviction_accepts_an_evicting_policy(tmp_path: Path) -> None:
    """With allow_eviction the start-up check passes and reports the policy."""
    with limited_redis(tmp_path, policy="allkeys-lru") as server:
        store = RedisTokenStore(server.url, allow_eviction=True)
        try:
            reading = await store.refuse_eviction()
        finally:
            await store.close()
    assert reading.policy == "allkeys-lru"


async def test_noeviction_passes_and_reports_the_memory(store: RedisTokenStore) -> None:
    """noeviction passes; the reading carries maxmemory and the mark."""
    reading = await store.refuse_eviction()
    assert (reading.policy, reading.max, reading.high_water) == ("noeviction", 8 * 2**20, 0.9)
    assert store.memory_reading == reading


async def test_health_is_ok_with_memory_below_the_mark(store: RedisTokenStore) -> None:
    """Below the mark the store is healthy and says how full it is."""
    health = await store.memory_health()
    assert health.status is None
    assert set(health.memory) == {"used", "max", "fraction", "high_water"}


async def test_writes_above_the_mark_are_refused_naming_the_memory(
    store: RedisTokenStore,
) -> None:
    """Past the mark a put is StoreMemoryFull carrying used, max and fraction."""
    await fill(store)
    with pytest.raises(StoreMemoryFull) as refused:
        await store.put(call_entry("late", 0))
    memory = refused.value.memory
    assert memory["fraction"] >= 0.9 and memory["max"] == 8 * 2**20
    assert (await store.memory_health()).status == "memory_full"


@pytest.mark.parametrize("write", ["begin_call", "ledger_failure"])
async def test_every_write_that_adds_capture_data_is_refused_above_the_mark(
    store: RedisTokenStore, write: str
) -> None:
    """begin_call and a ledger row are refused above the mark, as put is."""
    await fill(store)
    refused = (
        store.begin_call("late", "call-0")
        if write == "begin_call"
        else store.record_ledger_failure("late", "call-0", "worker_capture_failed")
    )
    with pytest.raises(StoreMemoryFull):
        await refused


async def test_freeze_drop_and_incomplete_work_above_the_mark(store: RedisTokenStore) -> None:
    """Above the mark a rollout is still marked incomplete, frozen and retired."""
    written = await fill(store)
    await store.mark_incomplete(written[0], "call-0")
    snapshot = await store.freeze(written[0])
    assert snapshot.incomplete and len(snapshot.entries) == 4
    assert await store.drop(written[0], snapshot_id=snapshot.snapshot_id, version=snapshot.version)


async def test_writes_resume_once_retires_free_memory(store: RedisTokenStore) -> None:
    """After enough rollouts are retired, a put goes through again."""
    written = await fill(store)
    for rollout_id in written[: len(written) // 2]:
        snapshot = await store.freeze(rollout_id)
        await store.drop(rollout_id, snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    await store.memory_health()  # a fresh reading, as the next writer's would be
    await store.put(call_entry("after", 0))
    assert len((await store.freeze("after")).entries) == 1


async def test_redis_oom_is_store_memory_full_at_once(unmarked: RedisTokenStore) -> None:
    """Without a mark, Redis's own OOM refusal is StoreMemoryFull, not a retried 503."""
    await fill(unmarked)
    with pytest.raises(StoreMemoryFull) as refused:
        await unmarked.put(call_entry("late", 0))
    assert refused.value.memory["max"] == 8 * 2**20


def _unflagged_freeze_refused(server: RedisProcess) -> bool:
    """Whether freeze.lua without its flag is refused now: proof Redis is in OOM."""
    source = script_source("freeze").split("\n", 1)[1]
    keys = [f"m:{{ng:probe}}:{n}" for n in range(14)]
    with plain_client(server.port) as client:
        try:
            client.eval(source, len(keys), *keys, "probe-snapshot")
        except redis.exceptions.OutOfMemoryError:
            return True
    return False


async def test_freeze_drop_incomplete_and_sweep_work_under_real_oom(
    server: RedisProcess, unmarked: RedisTokenStore
) -> None:
    """At maxmemory (the unflagged freeze is refused) the flagged scripts all run."""
    written = await fill(unmarked)
    assert _unflagged_freeze_refused(server)
    await unmarked.mark_incomplete(written[1])
    for rollout_id in written[:2]:
        snapshot = await unmarked.freeze(rollout_id)
        assert await unmarked.drop(
            rollout_id, snapshot_id=snapshot.snapshot_id, version=snapshot.version
        )
    report = await unmarked.admin.sweep(SweepRules(retired_older_than=0.0))
    assert {swept.rollout_id for swept in report.captures} >= set(written[:2])


def test_every_script_that_frees_memory_is_flagged_allow_oom() -> None:
    """freeze, drop, sweep, delete and mark_incomplete carry `#!lua flags=allow-oom` first."""
    for name in sorted(ALLOWED_UNDER_OOM):
        assert script_source(name).startswith("#!lua flags=allow-oom\n"), name


async def test_evictions_while_running_turn_health_to_captures_evicted(tmp_path: Path) -> None:
    """Under allkeys-lru (allowed) keys evicted after start make the health captures_evicted."""
    with limited_redis(tmp_path, policy="allkeys-lru") as server:
        store = RedisTokenStore(server.url, allow_eviction=True, memory_high_water=None)
        try:
            await store.refuse_eviction()
            for number in range(300):  # ~20 MB into 8 MB: Redis must evict
                await store.put(call_entry(f"evicted-{number}", 0, prompt_tokens=10_000))
            health = await store.memory_health()
        finally:
            await store.close()
    assert health.status == "captures_evicted" and health.evicted_keys > 0
