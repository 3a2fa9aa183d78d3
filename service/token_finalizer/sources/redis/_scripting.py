"""Running a Lua script on Redis or a Redis Cluster, and, when asked, WAIT for its replicas.

`WAIT N timeout` counts the replicas that have received every write *of its
own connection*, so it must follow the script on the connection that ran
it: from any other connection it proves nothing (that connection wrote
nothing, and WAIT answers at once). One server: a pipeline without MULTI
sends its commands down one connection, in order. A cluster: a pipeline
whose commands all name the same target node does the same on that node;
redirections are not followed inside it (that would run the script on
another connection): MOVED updates the slot map and is raised, ASK and
TRYAGAIN are raised, and the retry layer repeats the whole, idempotent,
call.

Between the script and WAIT, a short-lived marker key under the same hash
tag is written (`sync_key`): a script that changed nothing (a put repeated
after it was applied but not acknowledged) writes nothing, and WAIT after it
would count replicas against the connection's old offset. The marker makes
the connection's offset the server's current one, which covers the earlier
write. See docs/store-protocol.md#acknowledged-writes.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import (
    ClusterDownError,
    ConnectionError,
    MovedError,
    NoScriptError,
    TimeoutError,
)

from token_finalizer._constants import REDIS_SYNC_MARK_TTL_MS
from token_finalizer.sources.redis._retrying import NotAcknowledged

__all__ = ["LuaScript", "evalsha", "evalsha_then_wait"]

# WAIT may take the time left before the deadline less this margin (a share of
# it, at least the minimum), so that its answer (too few replicas) arrives
# before the deadline cuts the call, even on a busy machine.
_WAIT_MARGIN_SHARE = 0.2
_WAIT_MARGIN_MIN_S = 0.15


@dataclass(frozen=True, slots=True)
class LuaScript:
    """A script's source and the SHA1 Redis knows it by."""

    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        digest = hashlib.sha1(self.source.encode(), usedforsecurity=False).hexdigest()
        object.__setattr__(self, "sha", digest)


async def _load(client: Any, script: LuaScript, key: str, *, cluster: bool) -> None:
    """Load `script` where `key` lives (a cluster: on that primary only, which answers now)."""
    if cluster:
        node = client.get_node_from_key(key)
        await client.execute_command("SCRIPT LOAD", script.source, target_nodes=node)
    else:
        await client.script_load(script.source)


async def evalsha(
    client: Any, script: LuaScript, keys: Sequence[str], args: Sequence[Any], *, cluster: bool
) -> Any:
    """EVALSHA over `keys`, loading the script first where the server lost or never had it."""
    try:
        return await client.evalsha(script.sha, len(keys), *keys, *args)
    except NoScriptError:
        await _load(client, script, keys[0], cluster=cluster)
        return await client.evalsha(script.sha, len(keys), *keys, *args)


async def evalsha_then_wait(
    client: Any,
    script: LuaScript,
    keys: Sequence[str],
    args: Sequence[Any],
    *,
    cluster: bool,
    replicas: int,
    deadline: float,
    sync_key: str | None,
) -> Any:
    """The script, then (on its connection) WAIT for `replicas`; its reply once they have it.

    WAIT may take most of what is left until `deadline` (the event loop's
    clock). Raises NotAcknowledged when fewer replicas confirmed it in time.
    """
    loop = asyncio.get_running_loop()
    for _ in range(2):  # a second round only after loading the script
        left = deadline - loop.time()
        timeout_ms = max(1, int((left - max(left * _WAIT_MARGIN_SHARE, _WAIT_MARGIN_MIN_S)) * 1000))
        try:
            results = await _pipelined(
                client, script, keys, args, cluster, replicas, timeout_ms, sync_key
            )
        except Exception as exc:  # the node could not even be reached
            if cluster:
                await _learn_from(client, exc, keys[0])
            raise
        reply, acks = results[0], results[-1]
        if isinstance(reply, NoScriptError):
            if isinstance(acks, int) and acks < replicas:
                # Even the marker was not confirmed in time: nor would the script be.
                raise NotAcknowledged(
                    f"{acks} of {replicas} replica(s) answered within {timeout_ms} ms"
                )
            await _load(client, script, keys[0], cluster=cluster)
            continue
        failure = next((result for result in results if isinstance(result, Exception)), None)
        if failure is not None:
            if cluster:
                await _learn_from(client, failure, keys[0])
            raise failure
        if int(acks) < replicas:
            raise NotAcknowledged(
                f"{int(acks)} of {replicas} replica(s) confirmed it within {timeout_ms} ms"
            )
        return reply
    raise NoScriptError(f"the script {script.sha} stayed unknown to the server")


async def _learn_from(client: Any, failure: Exception, key: str) -> None:
    """Update what the cluster client knows after a failure inside a targeted pipeline.

    Outside pipelines redis-py does this itself; inside one it only hands the
    error back: a MOVED names the slot's new owner, and a node that stopped
    answering (or a cluster that is down) calls for the topology to be read
    again, the failed node asked last.
    """
    if isinstance(failure, MovedError):
        await client.nodes_manager.move_slot(failure)
    elif isinstance(failure, ConnectionError | TimeoutError | ClusterDownError):
        node = client.get_node_from_key(key)
        await client.nodes_manager.initialize(
            last_failed_node_name=None if node is None else node.name
        )


async def _pipelined(
    client: Any,
    script: LuaScript,
    keys: Sequence[str],
    args: Sequence[Any],
    cluster: bool,
    replicas: int,
    timeout_ms: int,
    sync_key: str | None,
) -> list[Any]:
    commands: list[tuple[Any, ...]] = [("EVALSHA", script.sha, len(keys), *keys, *args)]
    if sync_key is not None:
        commands.append(("SET", sync_key, b"1", "PX", REDIS_SYNC_MARK_TTL_MS))
    commands.append(("WAIT", replicas, timeout_ms))
    if not cluster:
        async with client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            return list(await pipe.execute(raise_on_error=False))
    node = client.get_node_from_key(keys[0])
    if node is None:
        raise ClusterDownError(f"no node is known to serve the slot of {keys[0]}")
    pipe = client.pipeline()
    for command in commands:
        pipe.execute_command(*command, target_nodes=node)
    return list(await pipe.execute(raise_on_error=False, allow_redirections=False))
