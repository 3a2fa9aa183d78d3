"""redis-py clients as this package uses them: one server, or a Redis Cluster from its seeds.

Both are built with redis-py's own retries off: `_retrying` is the one retry
layer, bounded by each operation's deadline (redis-py's retries have no
wait between tries and run out long before a failover is over). The
cluster client additionally:

- starts from any of several seed nodes, and replaces them by every node it
  discovers, so a seed's later death does not matter;
- never closes all its connections after a number of MOVED answers
  (`reinitialize_steps=0`): redis-py does that every 5th MOVED by default,
  under the commands other tasks are running on them, and then routes keyed
  commands to random primaries until it has read the topology again. A
  MOVED only updates the slot it names.

See docs/store-protocol.md#redis-cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from token_finalizer._constants import DEFAULT_REDIS_PORT, REDIS_CONNECT_TIMEOUT_CAP_S

__all__ = ["new_client"]


def _no_retries() -> Retry:
    return Retry(NoBackoff(), 0)


def new_client(
    seeds: Sequence[str],
    *,
    cluster: bool,
    timeout_s: float,
    extra_nodes: Sequence[tuple[str, int]] = (),
) -> Any:
    """A client of one server (`seeds[0]`), or of the cluster `seeds` (and `extra_nodes`,
    the (host, port) of nodes an earlier client knew) belong to."""
    connect_s = min(timeout_s, REDIS_CONNECT_TIMEOUT_CAP_S)
    if not cluster:
        return Redis.from_url(
            seeds[0],
            socket_timeout=timeout_s,
            socket_connect_timeout=connect_s,
            retry=_no_retries(),
            decode_responses=False,
        )
    addresses = [(urlsplit(seed).hostname or "", urlsplit(seed).port) for seed in seeds[1:]]
    others = [
        ClusterNode(host, port or DEFAULT_REDIS_PORT) for host, port in [*addresses, *extra_nodes]
    ]
    # The first seed's URL carries the credentials and TLS every node is reached with.
    return RedisCluster.from_url(
        seeds[0],
        startup_nodes=others,
        socket_timeout=timeout_s,
        socket_connect_timeout=connect_s,
        retry=_no_retries(),
        reinitialize_steps=0,
        decode_responses=False,
    )
