"""A redis store on a real 3-primary Redis Cluster behaves exactly as on one server.

The store contract (tests/service/sources/test_store_semantics.py: writes,
freeze, retire, admin, sweep), the read-only view lineage resolution reads
(test_committed_entries.py) and lineage resolution over the wire
(tests/service/store_server/test_resolve.py) and clearing staged calls
(test_staging_clear.py) run here unchanged, with
`store` a cluster store reached through one seed node (all but what is
refused before Redis is reached). Then what only a
cluster has: rollouts spread over every primary, listing and sweeping all of
them, the shared guard counting on the cluster, and health naming a node.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from types import ModuleType
from typing import Any

import pytest

from tests.service.sources import test_committed_entries, test_staging_clear, test_store_semantics
from tests.service.store_server import test_resolve
from tests.support.captures import make_entry
from tests.support.redis_cluster import RedisCluster, needs_redis_server
from tests.support.stores import swept_captures
from token_finalizer.cli import main
from token_finalizer.core.build import Build, MaskReason
from token_finalizer.core.errors import StoreNodeUnreachable
from token_finalizer.service.errors import MaskFractionExceeded
from token_finalizer.service.metrics import ServiceMetrics
from token_finalizer.service.redis_guard import RedisMaskFractionGuard
from token_finalizer.sources.redis import RedisTokenStore

pytestmark = [
    needs_redis_server,
    pytest.mark.anyio,
]

MASKED = Build.unusable("no capture", mask_reason=MaskReason.EMPTY_CAPTURE)


def _adopt(module: ModuleType, *, skip: frozenset[str] = frozenset()) -> None:
    """Collect `module`'s tests here as well (they then use this module's `store`)."""
    for name, test in vars(module).items():
        if name.startswith("test_") and name not in skip:
            assert name not in globals(), f"{name} is adopted twice"
            globals()[name] = test


# Left out: what is refused before Redis is reached (bad ids, malformed requests:
# the same code on one server), and the wire twin of the resolver's vectors.
_REFUSED_BEFORE_REDIS = frozenset(
    {"test_bad_rollout_ids_are_refused", "test_bad_call_ids_are_refused"}
)
_adopt(test_store_semantics, skip=_REFUSED_BEFORE_REDIS)
_adopt(test_committed_entries, skip=frozenset({"test_bad_rollout_id_is_refused"}))
_adopt(
    test_resolve,
    skip=frozenset(
        {
            "test_bad_rollout_id_is_422",
            "test_malformed_request_is_422",
            "test_non_json_body_is_422",
            "test_wire_request_answers_the_vector",
        }
    ),
)
# Clearing staged calls one by one (one script over the rollout's slot); not the file store's.
_adopt(
    test_staging_clear,
    skip=frozenset(
        {
            "test_clear_refuses_an_invalid_call_id",
            "test_file_clear_removes_the_tokens_from_disk",
            "test_file_clear_is_seen_by_another_process",
            "test_a_clear_killed_before_its_rename_leaves_the_file_whole",
        }
    ),
)
chat = test_staging_clear.chat
transport = test_resolve.transport
new_resolver = test_resolve.new_resolver
resolver = test_resolve.resolver
wire = test_resolve.wire


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    """Three primaries, no replicas: one cluster for the module, keys apart by prefix."""
    with RedisCluster(primaries=3, replicas=0) as running:
        yield running


def _open(cluster: RedisCluster, prefix: str | None = None) -> RedisTokenStore:
    prefix = prefix or f"tf-cluster:{uuid.uuid4().hex[:12]}:"
    # One seed only: the client must learn every other node from it.
    return RedisTokenStore(cluster.seed_urls[0], cluster=True, key_prefix=prefix, timeout_s=5)


@pytest.fixture
async def store(cluster: RedisCluster) -> AsyncIterator[RedisTokenStore]:
    """An empty cluster store under a prefix of this test alone."""
    opened = _open(cluster)
    yield opened
    await opened.close()


@pytest.fixture
async def admin_store(store: RedisTokenStore) -> RedisTokenStore:
    """The same store, for the adopted admin tests."""
    return store


# -- what only a cluster has ---------------------------------------------------------------


async def test_rollouts_spread_over_every_primary_are_all_listed(
    cluster: RedisCluster, store: RedisTokenStore
) -> None:
    """60 rollouts land on all three primaries; the listing names each one exactly once."""
    ids = [f"spread-{number}" for number in range(60)]
    for rollout_id in ids:
        await store.put(make_entry(rollout_id, "c1", [1], [2]))
    owners = {cluster.node_for_key(store.keys(rollout_id)[0]).node_id for rollout_id in ids}
    assert len(owners) == 3
    assert await store.admin.rollout_ids() == sorted(ids)


async def test_sweep_reaches_tombstones_on_every_primary(
    cluster: RedisCluster, store: RedisTokenStore
) -> None:
    """Retired rollouts on all three primaries are swept in one run."""
    ids = [f"swept-{number}" for number in range(30)]
    for rollout_id in ids:
        await store.put(make_entry(rollout_id, "c1", [1], [2]))
        snapshot = await store.freeze(rollout_id)
        await store.drop(rollout_id, snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    owners = {cluster.node_for_key(store.keys(rollout_id)[0]).node_id for rollout_id in ids}
    swept = await swept_captures(store, retired_older_than=0)
    assert len(owners) == 3
    assert sorted(capture.rollout_id for capture in swept) == sorted(ids)
    assert await store.admin.rollout_ids() == []


async def test_several_seeds_and_a_dead_one_first(cluster: RedisCluster) -> None:
    """A seed list whose first node answers nothing still reaches the cluster."""
    dead = "redis://127.0.0.1:1/0"
    store = RedisTokenStore(
        urls=[dead, *cluster.seed_urls[1:]],
        cluster=True,
        key_prefix=f"tf-seeds:{uuid.uuid4().hex[:8]}:",
    )
    try:
        await store.put(make_entry("seeded", "c1", [1], [2]))
        assert (await store.freeze("seeded")).version == 2
    finally:
        await store.close()


async def test_ping_answers_while_every_primary_does(store: RedisTokenStore) -> None:
    """Every primary answers PING: the store is reachable."""
    await store.ping()


def _guard(cluster: RedisCluster, prefix: str, **options: Any) -> RedisMaskFractionGuard:
    return RedisMaskFractionGuard(
        urls=cluster.seed_urls[:1],
        cluster=True,
        key_prefix=prefix,
        max_mask_fraction=0.5,
        min_samples=3,
        **options,
    )


async def test_guard_replicas_count_into_one_total_on_the_cluster(cluster: RedisCluster) -> None:
    """Two guards (two replicas) on the cluster trip the run on their sum, and both refuse."""
    prefix = f"tf-guard:{uuid.uuid4().hex[:8]}:"
    a, b = _guard(cluster, prefix), _guard(cluster, prefix)
    try:
        await a.observe("run", MASKED)
        await b.observe("run", MASKED)
        with pytest.raises(MaskFractionExceeded):
            await a.observe("run", MASKED)
        with pytest.raises(MaskFractionExceeded):
            await b.check("run")
        counts = await b.counts("run")
    finally:
        await a.aclose()
        await b.aclose()
    assert (counts["finalized"], counts["masked"], counts["tripped"]) == ("3", "3", "1")


async def test_guard_probe_reports_its_cluster(cluster: RedisCluster) -> None:
    """The guard's Redis is reported reachable while every primary answers."""
    guard = _guard(cluster, "tf-guard-probe:", metrics=ServiceMetrics())
    try:
        assert await guard.probe() == {"reachable": True}
    finally:
        await guard.aclose()


async def test_a_plain_store_on_one_node_is_unreachable_not_wrong(cluster: RedisCluster) -> None:
    """Without `cluster`, a rollout on another node answers MOVED until the deadline:
    StoreUnreachable (the finalizer's 503), never a wrong answer."""
    seed = cluster.primaries_now()[0]
    prefix = f"tf-plain:{uuid.uuid4().hex[:8]}:"
    plain = RedisTokenStore(seed.url, key_prefix=prefix, timeout_s=0.3)
    elsewhere = next(
        f"moved-{number}"
        for number in range(10_000)
        if cluster.node_for_key(plain.keys(f"moved-{number}")[0]).node_id != seed.node_id
    )
    try:
        with pytest.raises(StoreNodeUnreachable, match="MovedError"):
            await plain.freeze(elsewhere)
    finally:
        await plain.close()


# -- the store command line on the cluster ---------------------------------------------------


async def test_store_commands_reach_every_primary_from_one_seed(
    cluster: RedisCluster, store: RedisTokenStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """`store inspect`, `delete` and `sweep --redis-cluster` from one seed cover every primary."""
    ids = [f"cli-{number}" for number in range(12)]
    for rollout_id in ids:
        await store.put(make_entry(rollout_id, "c1", [1], [2]))
        snapshot = await store.freeze(rollout_id)
        await store.drop(rollout_id, snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    await store.put(make_entry("cli-open", "c1", [1], [2]))
    owners = {cluster.node_for_key(store.keys(rollout_id)[0]).node_id for rollout_id in ids}
    backend = ["--redis", cluster.seed_urls[0], "--redis-cluster", "--key-prefix", store.key_prefix]

    inspected = await asyncio.to_thread(main, ["store", "inspect", "cli-open", *backend])
    report = json.loads(capsys.readouterr().out)
    deleted = await asyncio.to_thread(main, ["store", "delete", "cli-open", "--yes", *backend])
    swept = await asyncio.to_thread(
        main, ["store", "sweep", "--retired-older-than", "0s", *backend]
    )
    out = capsys.readouterr().out
    assert len(owners) == 3
    assert (inspected, report["state"], report["entries"]) == (0, "open", 1)
    assert (deleted, swept) == (0, 0)
    assert f"removed {len(ids)} capture(s): {len(ids)} retired" in out
    assert await store.admin.rollout_ids() == []
