"""The Redis Cluster harness (`tests/support/redis_cluster.py`) against real redis-server nodes.

One 3 x 1 cluster serves the module; every test leaves it ready (all slots
served, replicas in sync), whatever roles it swapped. Tests that kill or
pause a node bring it back before they end.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from tests.support.redis_cluster import RedisCluster, needs_redis_server

pytestmark = needs_redis_server

KEYS = [f"tf-harness:{{r{i}}}:state" for i in range(600)]


@pytest.fixture
def client(cluster: RedisCluster) -> Iterator[redis.RedisCluster]:
    """A cluster client seeded with every node; the test's keys are removed afterwards."""
    seeds = [redis.cluster.ClusterNode(node.host, node.port) for node in cluster.nodes()]
    with redis.RedisCluster(startup_nodes=seeds, decode_responses=True) as connected:
        yield connected
        for key in KEYS:
            connected.delete(key)


def write_all(client: redis.RedisCluster) -> None:
    for number, key in enumerate(KEYS):
        client.set(key, str(number))


def read_all(client: redis.RedisCluster) -> list[str | None]:
    return [client.get(key) for key in KEYS]


def expected() -> list[str | None]:
    return [str(number) for number in range(len(KEYS))]


def test_start_builds_three_primaries_serving_every_slot(cluster: RedisCluster) -> None:
    """A started cluster has 3 primaries that together serve all 16384 slots."""
    primaries = cluster.primaries_now()
    assert len(primaries) == 3
    assert sum(node.slot_count for node in primaries) == REDIS_CLUSTER_HASH_SLOTS


def test_start_gives_every_primary_one_replica(cluster: RedisCluster) -> None:
    """Each primary is followed by exactly one replica."""
    for primary in cluster.primaries_now():
        assert len(cluster.replicas_of(primary)) == 1


def test_seed_urls_name_every_node(cluster: RedisCluster) -> None:
    """There is one seed URL per node, and each of them answers."""
    assert len(cluster.seed_urls) == 6
    for url in cluster.seed_urls:
        with redis.Redis.from_url(url) as direct:
            assert direct.ping()


def test_node_for_key_names_the_node_holding_it(
    cluster: RedisCluster, client: redis.RedisCluster
) -> None:
    """Keys written through the cluster client live on the node `node_for_key` names."""
    write_all(client)
    slots = {key_slot(key.encode()) for key in KEYS}
    owners = {cluster.node_for_key(key).node_id for key in KEYS}
    assert len(slots) > 500 and len(owners) == 3
    for number, key in enumerate(KEYS[:60]):
        with cluster.client(cluster.node_for_key(key)) as direct:
            assert direct.get(key) == str(number)


def test_reshard_moves_the_slots(cluster: RedisCluster) -> None:
    """After a 1000-slot reshard the target serves 1000 more slots, the source 1000 fewer."""
    source, target = cluster.primaries_now()[:2]
    cluster.reshard(1000, source, target)
    after = {node.node_id: node.slot_count for node in cluster.primaries_now()}
    assert after[source.node_id] == source.slot_count - 1000
    assert after[target.node_id] == target.slot_count + 1000


def test_reshard_keeps_every_key(cluster: RedisCluster, client: redis.RedisCluster) -> None:
    """Every key written before a 1000-slot reshard reads back after it."""
    write_all(client)
    source, target = cluster.primaries_now()[1:3]
    cluster.reshard(1000, source, target)
    assert read_all(client) == expected()


def test_reshard_from_a_thread_while_traffic_runs(
    cluster: RedisCluster, client: redis.RedisCluster
) -> None:
    """A reshard in a worker thread completes while keys are written, and none is lost."""
    source, target = cluster.primaries_now()[::2]
    failures: list[BaseException] = []

    def reshard() -> None:
        try:
            cluster.reshard(1000, source, target)
        except BaseException as exc:
            failures.append(exc)

    worker = threading.Thread(target=reshard)
    worker.start()
    rounds = 0
    while worker.is_alive() or rounds == 0:
        write_all(client)
        rounds += 1
    worker.join()
    assert failures == []
    assert read_all(client) == expected()


def test_kill_primary_promotes_its_replica(
    cluster: RedisCluster, client: redis.RedisCluster
) -> None:
    """Killing a primary makes its replica the primary of its slots, keeping its keys."""
    write_all(client)
    victim = cluster.node_for_key(KEYS[0])
    (replica,) = cluster.replicas_of(victim)
    cluster.wait_replicated(victim)
    cluster.kill_primary(victim)
    try:
        promoted = cluster.wait_failover(victim)
        assert promoted.node_id == replica.node_id
        assert read_all(client) == expected()
    finally:
        cluster.restart(victim)


def test_restart_after_failover_rejoins_as_replica(cluster: RedisCluster) -> None:
    """A killed primary that was failed over comes back as the replica of its successor."""
    victim = cluster.primaries_now()[0]
    cluster.kill_primary(victim)
    promoted = cluster.wait_failover(victim)
    cluster.restart(victim)
    (back,) = [node for node in cluster.nodes() if node.node_id == victim.node_id]
    assert back.role == "replica" and back.primary_id == promoted.node_id


def test_wait_replicated_returns_once_the_replica_has_every_write(
    cluster: RedisCluster, client: redis.RedisCluster
) -> None:
    """After wait_replicated, the replica of a primary reads every key written to it."""
    write_all(client)
    primary = cluster.node_for_key(KEYS[0])
    (replica,) = cluster.replicas_of(primary)
    cluster.wait_replicated(primary)
    mine = [(n, key) for n, key in enumerate(KEYS) if cluster.node_for_key(key) == primary]
    with cluster.client(replica) as direct:
        direct.execute_command("READONLY")
        assert [direct.get(key) for _, key in mine] == [str(n) for n, _ in mine]


def test_kill_primary_refuses_a_replica(cluster: RedisCluster) -> None:
    """kill_primary on a replica snapshot is a ValueError, and nothing is killed."""
    replica = next(node for node in cluster.nodes() if node.role == "replica")
    with pytest.raises(ValueError, match="not a primary"):
        cluster.kill_primary(replica)


def test_pause_of_the_replica_makes_wait_time_out(cluster: RedisCluster) -> None:
    """With its replica paused, WAIT 1 on a primary answers 0 acknowledgements."""
    primary = cluster.primaries_now()[0]
    (replica,) = cluster.replicas_of(primary)
    cluster.pause(replica)
    try:
        key = cluster.key_on(primary, "tf-harness:paused")
        with cluster.client(primary) as direct:
            direct.set(key, "1")
            assert direct.execute_command("WAIT", 1, 200) == 0
            direct.delete(key)
    finally:
        cluster.resume(replica)


def test_resume_of_the_replica_acknowledges_again(cluster: RedisCluster) -> None:
    """After a pause and resume, WAIT 1 on the primary answers 1 again."""
    primary = cluster.primaries_now()[0]
    (replica,) = cluster.replicas_of(primary)
    cluster.pause(replica)
    cluster.resume(replica)
    key = cluster.key_on(primary, "tf-harness:resumed")
    with cluster.client(primary) as direct:
        direct.set(key, "1")
        assert direct.execute_command("WAIT", 1, 5000) == 1
        direct.delete(key)


def test_leaving_the_block_kills_every_node_and_removes_its_files() -> None:
    """After an exception leaves the block, no node answers and the directory is gone."""
    running = RedisCluster(primaries=3)
    seen: dict[str, object] = {}

    def failing_test() -> None:
        with running:
            seen["ports"] = [node.port for node in running.nodes()]
            seen["root"] = running.directory
            raise KeyError("the test failed")

    with pytest.raises(KeyError):
        failing_test()
    root, ports = seen["root"], seen["ports"]
    assert isinstance(ports, list) and len(ports) == 3
    assert isinstance(root, Path) and not root.exists()
    for port in ports:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
