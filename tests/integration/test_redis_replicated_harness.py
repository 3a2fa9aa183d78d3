"""The primary-and-replica harness (`tests/support/redis_replicated.py`) on real redis-servers.

WAIT is what the harness exists for: these tests pin down that a paused
replica acknowledges nothing and a running one acknowledges at once.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import redis

from tests.support.redis_processes import needs_redis_server
from tests.support.redis_replicated import ReplicatedRedis

pytestmark = needs_redis_server


@pytest.fixture(scope="module")
def servers() -> Iterator[ReplicatedRedis]:
    """One primary with one replica."""
    with ReplicatedRedis(replica_count=1) as running:
        yield running


def test_start_leaves_the_replica_following_the_primary(servers: ReplicatedRedis) -> None:
    """The replica reports the primary's port as its master, with the link up."""
    (replica,) = servers.replicas
    with redis.Redis(port=replica.port, decode_responses=True) as client:
        info = client.info("replication")
    assert servers.primary is not None
    assert info["master_port"] == servers.primary.port and info["master_link_status"] == "up"


def test_a_write_is_acknowledged_by_the_running_replica(servers: ReplicatedRedis) -> None:
    """WAIT 1 after a write answers 1 while the replica runs."""
    with redis.Redis.from_url(servers.url) as client:
        client.set("tf-replicated:running", "1")
        assert client.execute_command("WAIT", 1, 5000) == 1


def test_a_paused_replica_acknowledges_nothing(servers: ReplicatedRedis) -> None:
    """WAIT 1 after a write answers 0 once its timeout passes while the replica is paused."""
    (replica,) = servers.replicas
    servers.pause(replica)
    try:
        with redis.Redis.from_url(servers.url) as client:
            client.set("tf-replicated:paused", "1")
            assert client.execute_command("WAIT", 1, 200) == 0
    finally:
        servers.resume(replica)


def test_a_restarted_replica_is_in_sync_again(servers: ReplicatedRedis) -> None:
    """A killed replica restarted with its files catches up, and acknowledges again."""
    (replica,) = servers.replicas
    servers.kill(replica)
    with redis.Redis.from_url(servers.url) as client:
        client.set("tf-replicated:missed", "1")
        servers.restart(replica)
        assert client.execute_command("WAIT", 1, 5000) == 1
    with redis.Redis(port=replica.port, decode_responses=True) as direct:
        assert direct.get("tf-replicated:missed") == "1"


def test_leaving_the_block_kills_both_servers() -> None:
    """After the block, neither port accepts a connection."""
    with ReplicatedRedis(replica_count=1) as running:
        assert running.primary is not None
        ports = [running.primary.port, *(replica.port for replica in running.replicas)]
    for port in ports:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
