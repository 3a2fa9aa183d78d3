"""Can each shard take writes? Every primary's replicas, read for /health and the metrics.

With `min_replicas_acked` N a state change is acknowledged only once N
replicas have it (WAIT), so a primary with fewer than N connected replicas
answers every write to its slots with 503 after the WAIT's time: the shard
is reachable but cannot take writes. `read_shards` asks each primary (of a
cluster; the one server otherwise) for `INFO replication` (its replicas
connected and `online`) and, in a cluster, its own `CLUSTER NODES` (the
replicas the cluster knows for it), so the replicas that are missing can be
named. A primary that does not answer in REDIS_PING_NODE_TIMEOUT_S is
unreachable. See docs/store-protocol.md#health.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from token_finalizer._constants import REDIS_PING_NODE_TIMEOUT_S
from token_finalizer.sources.redis._retrying import RetryingRedis, describe

__all__ = ["ShardReading", "read_shards", "unwritable_message", "unwritable_reason"]

_ONLINE = "online"


@dataclass(frozen=True, slots=True)
class ShardReading:
    """One primary as the last health check saw it.

    `online` are its replicas connected and in sync (`host:port`), `missing`
    the replicas the cluster knows for it that are not (a plain server: none
    known), `needed` the store's `min_replicas_acked`.
    """

    node: str
    reachable: bool
    online: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    needed: int = 0
    error: str | None = None

    @property
    def writable(self) -> bool:
        """Reachable, with the replicas every acknowledged write needs."""
        return self.reachable and len(self.online) >= self.needed

    def to_dict(self) -> dict[str, Any]:
        """What /health shows of the shard."""
        shown: dict[str, Any] = {
            "node": self.node,
            "reachable": self.reachable,
            "writable": self.writable,
            "replicas": list(self.online),
            "replicas_needed": self.needed,
        }
        if self.missing:
            shown["missing_replicas"] = list(self.missing)
        if self.error is not None:
            shown["error"] = self.error
        return shown


def unwritable_reason(shards: Sequence[ShardReading]) -> str | None:
    """Why some of `shards` cannot take writes, each named (None when every one can)."""
    return "; ".join(unwritable_message(shard) for shard in shards if not shard.writable) or None


def unwritable_message(shard: ShardReading) -> str:
    """Why the shard cannot take writes, naming its node and the replicas it lacks."""
    if not shard.reachable:
        return f"redis shard {shard.node} is unreachable: {shard.error}"
    missing = f" (missing: {', '.join(shard.missing)})" if shard.missing else ""
    return (
        f"redis shard {shard.node} cannot take writes: {len(shard.online)} of the "
        f"{shard.needed} connected replica(s) min_replicas_acked needs{missing}; every write "
        "to its slots answers 503 until they are back"
    )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _online(info: Any, node: str) -> tuple[str, ...]:
    """`host:port` of every replica INFO replication lists as online."""
    if isinstance(info, dict) and isinstance(info.get(node), dict):
        info = info[node]  # redis-py may wrap a node's answer in {node name: fields}
    if not isinstance(info, dict):
        return ()
    found = []
    for key, value in info.items():
        if not (isinstance(key, str) and key.startswith("slave") and key[5:].isdigit()):
            continue
        fields = value
        if not isinstance(fields, dict):  # `ip=...,port=...,state=...` unparsed
            fields = dict(part.partition("=")[::2] for part in _text(value).split(","))
        if _text(fields.get("state", "")) == _ONLINE:
            found.append(f"{_text(fields.get('ip', ''))}:{_text(fields.get('port', ''))}")
    return tuple(sorted(found))


def _known_replicas(nodes: Any) -> tuple[str, ...]:
    """The replicas a node's own `CLUSTER NODES` lists for it (`host:port`)."""
    lines = [line.split() for line in _text(nodes).splitlines() if line.strip()]
    mine = next((fields[0] for fields in lines if "myself" in fields[2].split(",")), None)
    return tuple(
        sorted(
            fields[1].split("@", 1)[0].split(",", 1)[0]
            for fields in lines
            if len(fields) > 3 and mine is not None and fields[3] == mine
        )
    )


async def _read_one(client: Any, node: Any, name: str, needed: int) -> ShardReading:
    try:
        async with asyncio.timeout(REDIS_PING_NODE_TIMEOUT_S):
            if node is None:
                info = await client.execute_command("INFO", "replication")
                known: tuple[str, ...] = ()
            else:
                info, nodes = await asyncio.gather(
                    client.execute_command("INFO", "replication", target_nodes=node),
                    client.execute_command("CLUSTER", "NODES", target_nodes=node),
                )
                known = _known_replicas(nodes)
    except TimeoutError:
        return ShardReading(name, False, needed=needed, error="no answer in time")
    except Exception as exc:
        return ShardReading(name, False, needed=needed, error=describe(exc))
    online = _online(info, name)
    missing = tuple(replica for replica in known if replica not in online)
    return ShardReading(name, True, online, missing, needed)


async def read_shards(redis: RetryingRedis, needed: int) -> tuple[ShardReading, ...]:
    """Every primary (the one server of a plain Redis), by name, with its replicas."""
    client = redis.client
    if not redis.cluster:
        return (await _read_one(client, None, redis.node, needed),)
    await client.initialize()
    primaries = sorted(client.get_primaries(), key=lambda node: node.name)
    readings = await asyncio.gather(
        *(_read_one(client, node, node.name, needed) for node in primaries)
    )
    return tuple(readings)
