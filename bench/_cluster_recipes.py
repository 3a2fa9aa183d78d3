"""bench.cluster_faults, the recipes: a Redis Cluster called robustly with redis-py (asyncio).

- `cluster_client(seeds)`: one client from several seed URLs;
- `ClusterCaller.run`: one idempotent operation, retried on anything
  transient until a deadline, the client rebuilt when it is confused;
- `script_then_wait` / `script_then_wait_single`: a script and `WAIT N` on
  the same connection (cluster, and one server);
- `ping_primaries`: every primary pinged, the first one down named.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

from redis.asyncio import Redis
from redis.asyncio import RedisCluster as AsyncRedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import (
    AuthenticationError,
    ClusterDownError,
    DataError,
    MovedError,
    NoPermissionError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
)

__all__ = [
    "SEED_TIMEOUT_S",
    "ClusterCaller",
    "NotAcknowledged",
    "Unavailable",
    "cluster_client",
    "ping_primaries",
    "script_then_wait",
    "script_then_wait_single",
]

T = TypeVar("T")

SEED_TIMEOUT_S = 2.0
_BACKOFF_BASE_S = 0.02
_BACKOFF_CAP_S = 0.25
# An abandoned client is closed this much later, once calls still running on
# it have finished (closing it at once breaks them mid-write).
_RETIRE_AFTER_S = 10.0


class Unavailable(Exception):
    """The operation did not succeed within its deadline; the last error is its cause."""


class NotAcknowledged(Exception):
    """WAIT counted fewer replicas than asked: the write may be applied but is not durable.

    Not retried here: the caller answers it as unavailable (503), and its
    client retries the idempotent write later.
    """


def cluster_client(seeds: Sequence[str], **options: Any) -> AsyncRedisCluster:
    """A cluster client that may start from any of `seeds` (redis:// URLs).

    redis-py then replaces the seeds by every node it discovers (the default
    `dynamic_startup_nodes=True`), so a seed's later death does not matter.
    """
    nodes = []
    for url in seeds:
        parts = urlsplit(url)
        nodes.append(ClusterNode(parts.hostname or "127.0.0.1", parts.port or 6379))
    first = urlsplit(seeds[0])
    if first.password:
        options.setdefault("password", first.password)
        options.setdefault("username", first.username or None)
    options.setdefault("socket_timeout", SEED_TIMEOUT_S)
    options.setdefault("socket_connect_timeout", SEED_TIMEOUT_S)
    # By default every 5th MOVED closes *all* the client's connections, under
    # the calls other tasks are running (they fail with AttributeError or
    # ConnectionError), and until the topology is read again commands go to
    # random primaries, which answer MOVED again: a storm during a reshard.
    # 0: a MOVED only updates the moved slot.
    options.setdefault("reinitialize_steps", 0)
    return AsyncRedisCluster(startup_nodes=nodes, **options)


def permanent(exc: BaseException) -> bool:
    """True for errors a retry cannot cure: a wrong request, or wrong credentials.

    The redirections and outages (MOVED, ASK, TRYAGAIN, CLUSTERDOWN, LOADING,
    READONLY, MASTERDOWN) are ResponseError subclasses and stay retryable; a
    plain ResponseError is the server refusing the request itself (a script
    error, WRONGTYPE, CROSSSLOT).
    """
    if isinstance(exc, DataError | AuthenticationError | NoPermissionError | NotAcknowledged):
        return True
    return type(exc) is ResponseError


def confusing(exc: BaseException) -> bool:
    """True for failures that say the client's own state is broken: rebuild it.

    Not a RedisError at all (AttributeError from a connection closed under a
    running call, IndexError, KeyError...), or redis-py giving up on the
    topology (RedisClusterException: no seed reachable, slots not covered).
    """
    return not isinstance(exc, RedisError) or isinstance(exc, RedisClusterException)


class ClusterCaller:
    """Runs idempotent operations on a Redis Cluster, retrying until a deadline.

    Every Exception that is not `permanent` is retried with jittered backoff
    until `deadline_s` has passed since the call began, then `Unavailable`
    is raised from the last error. A confusing error replaces the client by a
    new one seeded with the configured seeds and every node the old one knew.
    """

    def __init__(self, seeds: Sequence[str], *, deadline_s: float, **options: Any) -> None:
        self.seeds = list(seeds)
        self.deadline_s = deadline_s
        # One retry layer, this one: redis-py's own (10 immediate attempts
        # after a connection error, and a pipeline's 10 attempts each closing
        # every connection) would only spend the deadline without backoff.
        options.setdefault("retry", Retry(NoBackoff(), 0))
        self.options = options
        self.client = cluster_client(self.seeds, **options)
        self.rebuilt = 0
        # type name -> failed attempts that were retried (what the caller absorbed)
        self.absorbed: Counter[str] = Counter()
        # Replaced clients, closed `_RETIRE_AFTER_S` later (or by `aclose`).
        self._retired: set[AsyncRedisCluster] = set()
        self._timers: set[asyncio.Task[None]] = set()

    async def run(self, what: str, call: Callable[[AsyncRedisCluster], Awaitable[T]]) -> T:
        """`call(client)` until it succeeds or the deadline passes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.deadline_s
        failures = 0
        while True:
            client = self.client
            try:
                async with asyncio.timeout_at(deadline):
                    # Read the topology first if it is unknown (new client, or
                    # redis-py dropped it after CLUSTERDOWN): otherwise the
                    # command would be routed as if it had no key.
                    await client.initialize()
                    return await call(client)
            except TimeoutError as exc:
                if loop.time() >= deadline:
                    raise Unavailable(f"{what}: no success within {self.deadline_s} s") from exc
                last: Exception = exc
            except Exception as exc:
                if permanent(exc):
                    raise
                last = exc
            failures += 1
            self.absorbed[type(last).__name__] += 1
            if confusing(last):
                self._rebuild(client)
            pause = min(_BACKOFF_CAP_S, _BACKOFF_BASE_S * 2**failures) * random.uniform(0.5, 1.0)
            if loop.time() + pause >= deadline:
                raise Unavailable(
                    f"{what}: no success within {self.deadline_s} s: {type(last).__name__}: {last}"
                ) from last
            await asyncio.sleep(pause)

    def _rebuild(self, failed: AsyncRedisCluster) -> None:
        """Replace `failed` (once, however many calls saw it fail) and close it later."""
        if self.client is not failed:
            return
        known = [f"redis://{node.name}" for node in failed.get_nodes()]
        self.client = cluster_client(list(dict.fromkeys([*self.seeds, *known])), **self.options)
        self.rebuilt += 1
        self._retired.add(failed)
        timer = asyncio.create_task(self._close_later(failed))
        self._timers.add(timer)
        timer.add_done_callback(self._timers.discard)

    async def _close_later(self, client: AsyncRedisCluster) -> None:
        await asyncio.sleep(_RETIRE_AFTER_S)
        self._retired.discard(client)
        with contextlib.suppress(Exception):
            await client.aclose()

    async def aclose(self) -> None:
        """Close the client and every replaced one not closed yet."""
        for timer in list(self._timers):
            timer.cancel()
        await asyncio.gather(*self._timers, return_exceptions=True)
        for client in [*self._retired, self.client]:
            with contextlib.suppress(Exception):
                await client.aclose()
        self._retired.clear()


# -- WAIT on the connection that ran the script ---------------------------------------------


async def script_then_wait(
    client: AsyncRedisCluster,
    script: AsyncScript,
    keys: Sequence[str],
    args: Sequence[Any],
    *,
    replicas: int,
    timeout_ms: int,
) -> tuple[Any, int]:
    """Run `script` on the primary of its keys' slot, then WAIT there: (reply, acks).

    WAIT counts the replicas that have every write *of its connection*, so it
    must follow the script on the same connection. A cluster pipeline whose
    commands all name one target node sends them down one connection of that
    node, in order. Redirections are not followed (they would run the script
    on another connection): MOVED refreshes the slot map and raises, ASK and
    TRYAGAIN raise, and the caller retries the whole (idempotent) call.
    """
    node = client.get_node_from_key(keys[0])
    if node is None:
        raise ClusterDownError(f"no node serves the slot of {keys[0]}")
    for _ in range(2):  # a second round only after loading the script on that node
        pipe = client.pipeline()
        pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args, target_nodes=node)
        pipe.execute_command("WAIT", replicas, timeout_ms, target_nodes=node)
        reply, acks = await pipe.execute(raise_on_error=False, allow_redirections=False)
        if isinstance(reply, NoScriptError):
            await client.execute_command("SCRIPT LOAD", script.script, target_nodes=node)
            continue
        if isinstance(reply, MovedError):
            await client.nodes_manager.initialize()
        if isinstance(reply, Exception):
            raise reply
        if isinstance(acks, Exception):
            raise acks
        return reply, int(acks)
    raise NoScriptError(f"the script stayed unknown to {node.name}")


async def script_then_wait_single(
    client: Redis,
    script: AsyncScript,
    keys: Sequence[str],
    args: Sequence[Any],
    *,
    replicas: int,
    timeout_ms: int,
) -> tuple[Any, int]:
    """The same on one server: a pipeline without MULTI is one connection, in order.

    Passing the pipeline to the script makes redis-py load the script first
    (SCRIPT EXISTS / SCRIPT LOAD) if the server does not know it.
    """
    async with client.pipeline(transaction=False) as pipe:
        await script(keys=list(keys), args=list(args), client=pipe)
        pipe.execute_command("WAIT", replicas, timeout_ms)
        reply, acks = await pipe.execute()
    return reply, int(acks)


# -- health ---------------------------------------------------------------------------------


async def ping_primaries(client: AsyncRedisCluster, timeout_s: float) -> dict[str, str | None]:
    """PING every primary, at once: node name -> None, or the error of a primary that is down.

    Targeted commands are not retried by redis-py, so a dead node answers
    within `timeout_s`. When some PING fails, the topology is read again and
    only the nodes that are still primaries are asked again: a primary that
    was just replaced by its replica is not reported as down.
    """

    async def one(node: ClusterNode) -> str | None:
        try:
            async with asyncio.timeout(timeout_s):
                await client.execute_command("PING", target_nodes=node)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return None

    async def round_of(nodes: list[ClusterNode]) -> dict[str, str | None]:
        answers = await asyncio.gather(*(one(node) for node in nodes))
        return {node.name: answer for node, answer in zip(nodes, answers, strict=True)}

    try:
        await client.initialize()
        answers = await round_of(client.get_primaries())
        if all(answer is None for answer in answers.values()):
            return answers
        async with asyncio.timeout(timeout_s):
            await client.nodes_manager.initialize()
    except (RedisError, TimeoutError) as exc:
        return {"cluster": f"{type(exc).__name__}: {exc}"}
    return await round_of(client.get_primaries())
