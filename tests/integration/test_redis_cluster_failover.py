"""A primary dies and its replica takes over: nothing that was acknowledged is lost.

Real processes on loopback: a 3 x 1 cluster, `store serve --redis-cluster
--min-replicas-acked 1` and a finalizer whose sources (through the store
server, and directly with `min_replicas_acked: 1`) reach the same keys.
Writers and finalizers run with the client package's retry policy (503 +
Retry-After are waited for and repeated, with its real waits). A primary is
SIGKILLed; once its replica has taken over, the old primary is started again
(it rejoins as the new primary's replica, and writes to that shard are
acknowledged again). Afterwards every put, freeze and retire that was
acknowledged must be in the cluster; in the window callers saw 503s, each
with Retry-After, and nothing else went wrong.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import stamina

from tests.support.captures import make_entry
from tests.support.cluster_workload import Ledger, Workload, failover_during, lost, serving
from tests.support.redis_cluster import RedisCluster, needs_redis_server
from token_finalizer.sources.redis import RedisTokenStore
from token_finalizer_client.transport import RetryPolicy

pytestmark = needs_redis_server

WORKERS = 8
WARM_UP_S = 1.0
AFTER_S = 2.0
# The store server's deadline per operation: well under the shortest failover (the
# node timeout, 1 s, before the replica is even elected), so callers do see 503s in
# the window. At 1.5 s a quick failover was sometimes absorbed whole (no 503 at all).
REDIS_TIMEOUT_S = 0.5
# Generous: a caller must outlast the failover and the old primary's return.
RETRIES = 30


@pytest.fixture(scope="module")
def ledger(cluster: RedisCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ledger]:
    """The workload's ledger through one failover, and what the cluster lost of it."""
    prefix = f"tf-failover:{uuid.uuid4().hex[:8]}:"
    directory: Path = tmp_path_factory.mktemp("failover")
    with (
        stamina.set_testing(False),  # the client's real waits: Retry-After is honoured
        serving(
            cluster,
            directory,
            prefix=prefix,
            min_replicas_acked=1,
            redis_timeout_s=REDIS_TIMEOUT_S,
        ) as topology,
    ):

        async def scenario() -> Ledger:
            workload = Workload(
                topology, workers=WORKERS, retry_policy=RetryPolicy(max_retries=RETRIES)
            )
            result = await failover_during(cluster, workload, warm_up_s=WARM_UP_S, after_s=AFTER_S)
            store = topology.open_store()
            try:
                result.problems.extend(await lost(result, store))
            finally:
                await store.close()
            return result

        yield asyncio.run(scenario())


def test_nothing_acknowledged_is_lost(ledger: Ledger) -> None:
    """Every acknowledged put, freeze and retire is in the cluster after the failover."""
    assert ledger.problems == []


def test_callers_were_told_to_come_back_and_did(ledger: Ledger) -> None:
    """In the window: 503s only, each with Retry-After; every call then succeeded on retry."""
    server_errors = {status: n for status, n in ledger.statuses.items() if status >= 500}
    assert set(server_errors) == {503}, dict(ledger.statuses)
    assert "(none)" not in ledger.retry_after, dict(ledger.retry_after)
    assert len(ledger.frozen) >= 20 and len(ledger.retired) >= 8, dict(ledger.statuses)


def test_a_store_outlives_the_death_of_its_only_seed(cluster: RedisCluster) -> None:
    """Connected through one seed, a primary: it dies, and a write to its slots still succeeds
    (within the deadline, once its replica has taken over), as does a ping of every primary."""
    seed = cluster.primaries_now()[0]
    store = RedisTokenStore(
        seed.url, cluster=True, key_prefix=f"tf-seed:{uuid.uuid4().hex[:8]}:", timeout_s=15
    )
    rollout_id = next(
        f"seeded-{number}"
        for number in range(100_000)
        if cluster.node_for_key(store.keys(f"seeded-{number}")[0]).node_id == seed.node_id
    )

    async def scenario() -> int:
        try:
            await store.put(make_entry(rollout_id, "c1", [1], [2]))
            cluster.kill_primary(seed)
            await store.put(make_entry(rollout_id, "c2", [1, 2, 3], [4]))
            await asyncio.to_thread(cluster.wait_failover, seed)
            await store.ping()
            return (await store.freeze(rollout_id)).version
        finally:
            await store.close()

    try:
        version = asyncio.run(scenario())
    finally:
        cluster.restart(seed)
    assert version == 3
