"""What concerns every node: health (PING each primary, name the one down) and key listing.

A Redis Cluster holds each key on one primary, so listing keys means a SCAN
of every primary, and "reachable" means every primary answers. Both follow
the cluster as it changes: a primary replaced by its replica during a
listing is scanned again under its new name; a PING that fails is asked
again after the topology was read again, so a primary that was just
replaced is not reported as down. See docs/store-protocol.md#redis-cluster.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from typing import Any

from redis.asyncio.cluster import ClusterNode

from token_finalizer._constants import REDIS_PING_NODE_TIMEOUT_S, REDIS_PING_TIMEOUT_S
from token_finalizer.core.errors import ClusterModeRefused, StoreNodeUnreachable
from token_finalizer.core.redaction import redact
from token_finalizer.sources.redis._retrying import RetryingRedis, describe

__all__ = ["check_cluster_mode", "ping_every_primary", "scan_every_primary"]

_PRIMARY = "primary"


_NO_ANSWER = "no answer to PING within"


async def _answer(call: Any, timeout_s: float) -> str | None:
    """None when `call` answers within `timeout_s`, else why not."""
    try:
        async with asyncio.timeout(max(0.0, timeout_s)):
            await call
    except TimeoutError:
        return f"{_NO_ANSWER} {timeout_s:.1f} s"
    except Exception as exc:
        return describe(exc)
    return None


class _Budget:
    """What is left of one probe's time; each node gets at most REDIS_PING_NODE_TIMEOUT_S."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.deadline = self._loop.time() + REDIS_PING_TIMEOUT_S

    def per_node(self) -> float:
        return min(REDIS_PING_NODE_TIMEOUT_S, self.deadline - self._loop.time())


async def _ping_one_server(client: Any, budget: _Budget) -> str | None:
    # Twice: the first PING may meet a pooled connection the server has closed since.
    problem = await _answer(client.ping(), budget.per_node())
    if problem is not None:
        problem = await _answer(client.ping(), budget.per_node())
    return problem


async def _ping_round(client: Any, budget: _Budget) -> dict[str, str | None]:
    nodes: list[ClusterNode] = client.get_primaries()
    timeout_s = budget.per_node()
    answers = await asyncio.gather(
        *(_answer(client.execute_command("PING", target_nodes=node), timeout_s) for node in nodes)
    )
    return {node.name: answer for node, answer in zip(nodes, answers, strict=True)}


async def _ping_cluster(client: Any, budget: _Budget) -> dict[str, str | None]:
    """Node name -> None, or why the primary does not answer (asked twice if it failed)."""
    async with asyncio.timeout_at(budget.deadline):
        await client.initialize()
    first = await _ping_round(client, budget)
    if all(answer is None for answer in first.values()):
        return first
    # A failed PING may be a stale connection, or a primary replaced by its
    # replica since the topology was read: read it again and ask again.
    try:
        async with asyncio.timeout_at(budget.deadline):
            await client.nodes_manager.initialize()
            return await _ping_round(client, budget)
    except Exception:  # no time left, or no topology now: the first round's answers stand
        return first


def _worst(answers: dict[str, str | None]) -> str | None:
    """The node to name: one that failed outright before one that was only slow, by name."""
    down = [name for name, problem in answers.items() if problem is not None]
    return min(
        down, key=lambda name: (str(answers[name]).startswith(_NO_ANSWER), name), default=None
    )


async def ping_every_primary(redis: RetryingRedis) -> None:
    """Return when the server (every primary of a cluster) answers PING.

    Raises StoreNodeUnreachable `redis node host:port: <why>` naming a node
    that does not (one that failed outright before one that was only slow),
    all within REDIS_PING_TIMEOUT_S.
    """
    budget = _Budget()
    try:
        if redis.cluster:
            answers = await _ping_cluster(redis.client, budget)
        else:
            answers = {redis.node: await _ping_one_server(redis.client, budget)}
    except Exception as exc:  # no seed answered in time: name the first one
        answers = {redis.node: describe(exc) if str(exc) else f"{_NO_ANSWER} the probe's time"}
    node = _worst(answers)
    if node is not None:
        raise StoreNodeUnreachable(redact(f"redis node {node}: {answers[node]}"), node)


async def check_cluster_mode(redis: RetryingRedis) -> None:
    """ClusterModeRefused when a server configured as one Redis is a Redis Cluster node.

    Such a node answers PING and serves its own slots only: every other key is
    a MOVED, which writers retry as if the store were down (issue 29). Asked
    once, at start; a cluster client is already refused by a plain server.
    """
    if redis.cluster:
        return
    info = await redis.call("cluster mode check", lambda client: client.info("cluster"))
    if int(info.get("cluster_enabled", 0)) == 1:
        raise ClusterModeRefused(
            redact(
                f"redis node {redis.node} is a Redis Cluster node (cluster_enabled:1): give "
                "--redis-cluster (configuration: `cluster: true`) to reach every slot"
            )
        )


async def _primary_names(client: Any) -> list[str]:
    return sorted(node.name for node in client.get_primaries())


async def _scan_server_page(
    client: Any, *, at: int, match: str, count: int
) -> tuple[int, list[bytes]]:
    cursor, keys = await client.scan(at, match=match, count=count)
    return int(cursor), list(keys)


async def _scan_page(
    client: Any, *, node_name: str, cursor: int, match: str, count: int
) -> tuple[int, list[bytes]] | None:
    """One SCAN page of one primary; None when that node is no primary any more."""
    node = client.get_node(node_name=node_name)
    if node is None or node.server_type != _PRIMARY:
        return None
    cursors, keys = await client.execute_command(
        "SCAN", cursor, "MATCH", match, "COUNT", count, target_nodes=node
    )
    return int(cursors[node_name]), list(keys)


async def _scan_server(redis: RetryingRedis, match: str, count: int) -> AsyncIterator[bytes]:
    cursor = 0
    while True:
        cursor, keys = await redis.call(
            "listing keys",
            functools.partial(_scan_server_page, at=cursor, match=match, count=count),
        )
        for key in keys:
            yield key
        if cursor == 0:
            return


async def scan_every_primary(redis: RetryingRedis, match: str, count: int) -> AsyncIterator[bytes]:
    """Every key matching `match` on the server, or on every primary of the cluster.

    A key may come twice (a node scanned again after a failover); every
    listed key existed at some moment of the listing.
    """
    if not redis.cluster:
        async for key in _scan_server(redis, match, count):
            yield key
        return
    scanned: set[str] = set()
    while True:
        primaries = await redis.call("listing primaries", _primary_names)
        todo = [name for name in primaries if name not in scanned]
        if not todo:
            return
        for name in todo:
            scanned.add(name)
            cursor = 0
            while True:
                page = await redis.call(
                    f"listing keys of {name}",
                    functools.partial(
                        _scan_page, node_name=name, cursor=cursor, match=match, count=count
                    ),
                )
                if page is None:  # replaced meanwhile: its successor is scanned next round
                    break
                cursor, keys = page
                for key in keys:
                    yield key
                if cursor == 0:
                    break
