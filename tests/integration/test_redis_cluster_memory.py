"""The memory rules on a real Redis Cluster: every primary is checked (docs/capacity.md).

One primary's eviction policy is enough to refuse the store at start, and
the fullest primary decides the memory reading (it is the first to refuse).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from tests.support.redis_cluster import RedisCluster, needs_redis_server
from tests.support.redis_processes import plain_client
from token_finalizer.core.errors import EvictionPolicyRefused
from token_finalizer.sources.redis import RedisTokenStore

pytestmark = [pytest.mark.anyio, needs_redis_server]


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster(primaries=3, replicas=0) as running:
        yield running


@pytest.fixture
async def store(cluster: RedisCluster) -> AsyncIterator[RedisTokenStore]:
    opened = RedisTokenStore(urls=cluster.seed_urls, cluster=True)
    yield opened
    await opened.close()


def _configure(port: int, **settings: str) -> None:
    with plain_client(port) as client:
        for name, value in settings.items():
            client.config_set(name.replace("_", "-"), value)


async def test_one_evicting_primary_refuses_the_store_naming_it(
    cluster: RedisCluster, store: RedisTokenStore
) -> None:
    """allkeys-lru on the second primary alone: refused, and the message names that node."""
    victim = cluster.primaries_now()[1]
    _configure(victim.port, maxmemory_policy="allkeys-lru")
    try:
        with pytest.raises(EvictionPolicyRefused) as refused:
            await store.refuse_eviction()
    finally:
        _configure(victim.port, maxmemory_policy="noeviction")
    assert victim.address in str(refused.value) and "allkeys-lru" in str(refused.value)


async def test_the_fullest_primary_decides_the_memory_reading(
    cluster: RedisCluster, store: RedisTokenStore
) -> None:
    """A primary with a maxmemory below its use is the reading's node, above the mark."""
    victim = cluster.primaries_now()[2]
    _configure(victim.port, maxmemory=str(512 * 1024))
    try:
        health = await store.memory_health()
        reading = store.memory_reading
    finally:
        _configure(victim.port, maxmemory="0")
    assert reading is not None and reading.node == victim.address
    assert health.status == "memory_full" and reading.above_mark
