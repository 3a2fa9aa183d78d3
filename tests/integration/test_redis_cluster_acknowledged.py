"""`min_replicas_acked`: a state change is acknowledged only once replicas have it (WAIT).

Real `redis-server` processes: one primary with a replica, and a 3 x 1
cluster. With the replica paused (SIGSTOP: connected, silent) a write must
be refused, not acknowledged, and the refusal is "come back later"
(StoreUnreachable: 503 + Retry-After at the store server), never a masked
record. A write repeated while the replica is still paused is refused too:
the first attempt was applied on the primary, so the repeat changes nothing,
and WAIT must still wait for the first attempt's write.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import redis

from tests.support.captures import make_entry, record_for
from tests.support.redis_cluster import RedisCluster, needs_redis_server
from tests.support.redis_replicated import ReplicatedRedis
from tests.support.servers import free_port, running_process
from token_finalizer.core.build import Build, MaskReason
from token_finalizer.core.delivery import finalize_record
from token_finalizer.core.errors import StoreUnreachable
from token_finalizer.service.metrics import ServiceMetrics
from token_finalizer.service.redis_guard import RedisMaskFractionGuard
from token_finalizer.sources.redis import RedisTokenStore

pytestmark = [
    needs_redis_server,
    pytest.mark.anyio,
]

# A refused write waits this long for an acknowledgement first: short. Writes
# that must be acknowledged get the patient deadline (a busy machine may take
# a while to schedule the replica).
TIMEOUT_S = 1.0
PATIENT_S = 10.0
MASKED = Build.unusable("no capture", mask_reason=MaskReason.EMPTY_CAPTURE)


@pytest.fixture(scope="module")
def servers() -> Iterator[ReplicatedRedis]:
    """One primary and one replica, no cluster."""
    with ReplicatedRedis(replica_count=1) as running:
        yield running


def _acked_store(url: str, prefix: str, timeout_s: float = PATIENT_S) -> RedisTokenStore:
    return RedisTokenStore(url, key_prefix=prefix, timeout_s=timeout_s, min_replicas_acked=1)


@pytest.fixture
async def store(servers: ReplicatedRedis) -> AsyncIterator[RedisTokenStore]:
    """A store on the primary that waits for its one replica (patiently)."""
    opened = _acked_store(servers.url, f"tf-acked:{uuid.uuid4().hex[:8]}:")
    yield opened
    await opened.close()


@pytest.fixture
async def impatient(
    store: RedisTokenStore, servers: ReplicatedRedis
) -> AsyncIterator[RedisTokenStore]:
    """The same keys through a store with a short deadline, for the writes to be refused."""
    opened = _acked_store(servers.url, store.key_prefix, TIMEOUT_S)
    yield opened
    await opened.close()


def _on_replica(servers: ReplicatedRedis, key: str, field: str) -> bytes | None:
    (replica,) = servers.replicas
    with redis.Redis.from_url(replica.url) as client:
        value = client.hget(key, field)
    return value if isinstance(value, bytes) else None


async def test_an_acknowledged_put_is_on_the_replica(
    servers: ReplicatedRedis, store: RedisTokenStore
) -> None:
    """Once put returns, the replica holds the entry."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    assert _on_replica(servers, store.keys("r1")[1], "c1") is not None


async def test_with_the_replica_paused_a_put_is_refused(
    servers: ReplicatedRedis, store: RedisTokenStore, impatient: RedisTokenStore
) -> None:
    """Replica paused: the put is refused as unreachable, its repeat too; resumed: acknowledged."""
    entry = make_entry("r2", "c1", [1], [2])
    # The repeat comes from another writer (another store server, say), whose
    # connection's own last write the replica did confirm.
    other = _acked_store(servers.url, store.key_prefix, TIMEOUT_S)
    await store.put(make_entry("r2-earlier", "c1", [1], [2]))
    (replica,) = servers.replicas
    servers.pause(replica)
    try:
        with pytest.raises(StoreUnreachable, match="not acknowledged: 0 of 1 replica"):
            await impatient.put(entry)
        # Applied on the primary but unconfirmed: the identical repeat changes
        # nothing, and must not be confirmed by a WAIT that has nothing to wait for.
        with pytest.raises(StoreUnreachable, match="not acknowledged"):
            await other.put(entry)
    finally:
        servers.resume(replica)
        await other.close()
    await store.put(entry)
    assert _on_replica(servers, store.keys("r2")[1], "c1") is not None


async def test_with_the_replica_paused_finalize_is_retried_not_masked(
    servers: ReplicatedRedis, store: RedisTokenStore, impatient: RedisTokenStore
) -> None:
    """A freeze nobody replicated is "come back later" for the finalizer, never a masked record."""
    await store.put(make_entry("r3", "c1", [1], [2]))
    (replica,) = servers.replicas
    servers.pause(replica)
    try:
        with pytest.raises(StoreUnreachable):
            await finalize_record(record_for("r3"), impatient, raise_unreachable=True)
    finally:
        servers.resume(replica)
    build = await finalize_record(record_for("r3"), store, raise_unreachable=True)
    assert build is not None and not build.mask_sample


async def test_without_min_replicas_acked_nothing_waits(servers: ReplicatedRedis) -> None:
    """The default (0) acknowledges at once, replica paused or not."""
    store = RedisTokenStore(servers.url, key_prefix="tf-unacked:", timeout_s=TIMEOUT_S)
    (replica,) = servers.replicas
    servers.pause(replica)
    try:
        await store.put(make_entry(f"r-{uuid.uuid4().hex[:8]}", "c1", [1], [2]))
    finally:
        servers.resume(replica)
        await store.close()


def test_store_server_answers_503_with_retry_after_while_unacknowledged(
    servers: ReplicatedRedis,
) -> None:
    """`store serve --min-replicas-acked 1`: replica paused, PUT is 503 + Retry-After: 1."""
    port = free_port()
    prefix = f"tf-served-acked:{uuid.uuid4().hex[:8]}:"
    args = ["store", "serve", "--redis", servers.url, "--key-prefix", prefix, "--port", str(port)]
    args += ["--min-replicas-acked", "1", "--redis-timeout", str(TIMEOUT_S)]
    entry = make_entry("served", "c1", [1], [2])
    url = f"http://127.0.0.1:{port}/ng-rollout/served/training-token-capture/calls/c1"
    (replica,) = servers.replicas
    with running_process(args, port=port):
        servers.pause(replica)
        try:
            refused = httpx.put(url, json=entry, timeout=10)
        finally:
            servers.resume(replica)
        accepted = httpx.put(url, json=entry, timeout=10)
    assert (refused.status_code, refused.headers.get("retry-after")) == (503, "1")
    assert "not acknowledged" in refused.json()["error"]
    assert accepted.status_code == 200


# -- the same on a cluster ----------------------------------------------------------------


async def test_cluster_refuses_only_where_the_replica_is_paused(cluster: RedisCluster) -> None:
    """One shard's replica paused: its rollouts are refused, the other shards acknowledge."""
    store = RedisTokenStore(
        urls=cluster.seed_urls,
        cluster=True,
        key_prefix=f"tf-cluster-acked:{uuid.uuid4().hex[:8]}:",
        timeout_s=TIMEOUT_S,
        min_replicas_acked=1,
    )
    paused_primary = cluster.primaries_now()[0]
    (replica,) = cluster.replicas_of(paused_primary)
    ids = [f"a{number}" for number in range(12)]
    on_paused = {
        rollout_id
        for rollout_id in ids
        if cluster.node_for_key(store.keys(rollout_id)[0]).node_id == paused_primary.node_id
    }
    refused: set[str] = set()
    cluster.pause(replica)
    try:
        for rollout_id in ids:
            try:
                await store.put(make_entry(rollout_id, "c1", [1], [2]))
            except StoreUnreachable:
                refused.add(rollout_id)
    finally:
        cluster.resume(replica)
    patient = RedisTokenStore(
        urls=cluster.seed_urls,
        cluster=True,
        key_prefix=store.key_prefix,
        timeout_s=PATIENT_S,
        min_replicas_acked=1,
    )
    try:
        for rollout_id in sorted(refused):
            await patient.put(make_entry(rollout_id, "c1", [1], [2]))
    finally:
        await store.close()
        await patient.close()
    assert on_paused and refused == on_paused


async def test_cluster_guard_fails_open_when_its_count_is_unacknowledged(
    cluster: RedisCluster,
) -> None:
    """guard min_replicas_acked: with the run's replica paused the count fails open (counted)."""
    metrics = ServiceMetrics()
    guard = RedisMaskFractionGuard(
        urls=cluster.seed_urls,
        cluster=True,
        min_replicas_acked=1,
        key_prefix=f"tf-guard-acked:{uuid.uuid4().hex[:8]}:",
        max_mask_fraction=0.0,
        min_samples=1,
        timeout_s=TIMEOUT_S,
        metrics=metrics,
    )
    primary = cluster.node_for_key(guard.key("run"))
    (replica,) = cluster.replicas_of(primary)
    cluster.pause(replica)
    try:
        await guard.observe("run", MASKED)  # would trip the run if it were acknowledged
    finally:
        cluster.resume(replica)
        await guard.aclose()
    skipped = metrics.registry.get_sample_value(
        "token_finalizer_guard_unavailable_total", {"operation": "observe"}
    )
    assert skipped == 1.0
