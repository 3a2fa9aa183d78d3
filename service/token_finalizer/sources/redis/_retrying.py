"""The one retry layer over Redis: each operation retried until its deadline, then our error.

A Redis Cluster changes under its clients: slots move (MOVED, ASK, TRYAGAIN),
a primary dies and its replica takes over (connection errors, CLUSTERDOWN,
for about the cluster's node timeout plus a second), and redis-py's cluster
client may fail in ways that are not Redis errors at all (a connection it
closed under a running command: `AttributeError ... writelines`). A single
server restarts, or drops a pooled connection. None of that may reach a
user as anything but a short delay, or, past the deadline, a "come back
later" (StoreUnreachable: 503 at the store server and at the finalizer,
never a masked record, never a 500).

`RetryingRedis.call(what, step)` runs `step(client)`:

- until it succeeds, or the operation's deadline (`timeout_s`) has passed,
  with jittered exponential backoff between tries;
- a cluster client reads the topology first when it does not know it;
- an error that says the client's own state is broken (anything that is
  not a Redis error, or redis-py giving up on the topology) replaces the
  client by a fresh one, seeded with the configured seeds and every node the
  old one knew; the old one is closed later, once calls on it are over;
- an error a retry cannot cure is raised at once: refused credentials
  (StoreUnreachable: the store cannot be used, nothing was done), a request
  Redis refuses (a script error, a key of the wrong type: SourceUnavailable),
  Redis out of memory (OOM at `maxmemory`: StoreMemoryFull, docs/capacity.md);
- `idempotent=False` (the guard's counting script) retries only errors that
  prove the command did not run (Redis answered with an error, or the
  client did not send it); after anything else it may have run once.

See docs/store-protocol.md#redis-cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    BusyLoadingError,
    DataError,
    NoPermissionError,
    OutOfMemoryError,
    RedisClusterException,
    RedisError,
    ResponseError,
)

from token_finalizer._constants import (
    REDIS_REPLACE_MIN_INTERVAL_S,
    REDIS_REPLACED_CLIENT_CLOSE_S,
    REDIS_RETRY_BASE_S,
    REDIS_RETRY_CAP_S,
)
from token_finalizer.core.errors import (
    SourceUnavailable,
    StoreMemoryFull,
    StoreNodeUnreachable,
    StoreUnreachable,
)
from token_finalizer.core.redaction import redact
from token_finalizer.core.store_urls import redis_node_name
from token_finalizer.sources.redis._clients import new_client

__all__ = ["NotAcknowledged", "RetryingRedis", "describe", "failed_node"]

T = TypeVar("T")

# Replies of Redis that name a passing state in their first word although
# redis-py has no class for them (it raises a plain ResponseError).
_PASSING_REPLIES = ("BUSY ", "NOREPLICAS ")


class NotAcknowledged(RedisError):
    """WAIT counted fewer replicas than required: the write may be applied but is not durable.

    Never retried within the operation: the caller answers "come back later",
    and its retry of the (idempotent) write is safe.
    """


def describe(exc: BaseException) -> str:
    """`Type: message`, the type alone without a message."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def failed_node(exc: BaseException) -> str | None:
    """The `host:port` a redis-py cluster error names as the node it failed on, if any."""
    node = getattr(exc, "connection", None)  # set by the cluster client on node errors
    name = getattr(node, "name", None)
    return name if isinstance(name, str) else None


def _refused_login(exc: BaseException) -> bool:
    return isinstance(exc, AuthenticationError | AuthorizationError | NoPermissionError)


def _refused_request(exc: BaseException) -> bool:
    """True for a request Redis refuses as such (a script error, WRONGTYPE): it fails again.

    MOVED, ASK, TRYAGAIN, CLUSTERDOWN, READONLY, MASTERDOWN, NOSCRIPT, LOADING
    and OOM have classes of their own and pass (OOM is answered apart, at once);
    so do BUSY and NOREPLICAS.
    """
    if isinstance(exc, DataError):
        return True
    return type(exc) is ResponseError and not str(exc).startswith(_PASSING_REPLIES)


def _confusing(exc: BaseException) -> bool:
    """True when the client's own state is broken: not a Redis error, or no usable topology."""
    return not isinstance(exc, RedisError) or isinstance(exc, RedisClusterException)


def _not_run(exc: BaseException) -> bool:
    """True when the failed command certainly did not run (the server refused it, or the
    client could not route it): only then is a non-idempotent command retried."""
    return isinstance(exc, ResponseError | BusyLoadingError | RedisClusterException)


class RetryingRedis:
    """One Redis server or Redis Cluster, reached with retries until each operation's deadline.

    `label` and `where` open every error message ("redis store redis://h:6379/0").
    A `client` passed in is the caller's: it is used as it is, never replaced
    and never closed.
    """

    def __init__(
        self,
        seeds: Sequence[str],
        *,
        cluster: bool,
        timeout_s: float,
        label: str,
        where: str,
        client: Any = None,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.seeds = tuple(seeds)
        self.cluster = cluster
        self.timeout_s = timeout_s
        self.label = label
        self.where = where
        self._owns_client = client is None
        self.client: Any = (
            new_client(self.seeds, cluster=cluster, timeout_s=timeout_s)
            if client is None
            else client
        )
        self.replaced = 0
        self._replaced_at = -REDIS_REPLACE_MIN_INTERVAL_S
        self._replaced_clients: set[Any] = set()
        self._timers: set[asyncio.Task[None]] = set()

    @property
    def node(self) -> str:
        """`host:port` of the server (a cluster: of its first seed), as health reports name it."""
        return redis_node_name(self.seeds[0]) if self.seeds else self.where

    def _message(self, what: str, detail: str) -> str:
        return redact(f"{self.label} {self.where}: {what}: {detail}")

    async def call(
        self,
        what: str,
        step: Callable[[Any], Awaitable[T]],
        *,
        idempotent: bool = True,
    ) -> T:
        """`step(client)` until it succeeds or the deadline (`timeout_s` from now) passes.

        Raises StoreUnreachable (StoreNodeUnreachable when the failed node is
        known) after the deadline, for refused credentials and for too few
        replica acknowledgements; SourceUnavailable for a request Redis refuses.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        failures = 0
        while True:
            client = self.client
            try:
                async with asyncio.timeout_at(deadline):
                    if self.cluster:
                        # Unknown topology (a new client, or redis-py dropped it after
                        # CLUSTERDOWN): read it first, or a keyed command is routed at random.
                        await client.initialize()
                    return await step(client)
            except Exception as exc:
                last = exc
            self._give_up_on(what, last, idempotent=idempotent)
            failures += 1
            if self._owns_client and _confusing(last):
                self._replace(client)
            pause = min(REDIS_RETRY_CAP_S, REDIS_RETRY_BASE_S * 2 ** (failures - 1))
            pause *= random.uniform(0.5, 1.0)
            if loop.time() + pause >= deadline:
                raise self._unreachable(what, last, waited=True) from None
            await asyncio.sleep(pause)

    def _give_up_on(self, what: str, exc: Exception, *, idempotent: bool) -> None:
        """Raise at once for an error no retry cures (or that a retry must not repeat)."""
        if isinstance(exc, TimeoutError) and not isinstance(exc, RedisError):
            # The deadline (asyncio's timeout) passed in the middle of a try.
            raise self._unreachable(what, exc, waited=True) from None
        if isinstance(exc, NotAcknowledged):
            raise StoreUnreachable(
                self._message(
                    what,
                    f"not acknowledged: {exc}; it may have been applied, and repeating it is safe",
                )
            ) from None
        if _refused_login(exc):
            raise StoreUnreachable(self._message(what, f"refused: {describe(exc)}")) from None
        if isinstance(exc, OutOfMemoryError):
            # Redis at `maxmemory` refused a write: no retry frees memory within a model
            # call's time, so the writer hears it now (docs/capacity.md).
            raise StoreMemoryFull(self._message(what, describe(exc))) from None
        if _refused_request(exc):
            raise SourceUnavailable(self._message(what, describe(exc))) from None
        if not idempotent and not _not_run(exc):
            raise self._unreachable(what, exc, waited=False) from None

    def _unreachable(self, what: str, exc: BaseException, *, waited: bool) -> StoreUnreachable:
        detail = describe(exc)
        if isinstance(exc, TimeoutError) and not isinstance(exc, RedisError):
            detail = f"no answer within the deadline of {self.timeout_s:g} s"
        elif waited:
            detail = f"still failing after retries for up to {self.timeout_s:g} s: {detail}"
        message = self._message(f"{what} failed", detail)
        node = failed_node(exc) if self.cluster else self.node
        return StoreUnreachable(message) if node is None else StoreNodeUnreachable(message, node)

    def _replace(self, failed: Any) -> None:
        """Put a fresh client in place of `failed` (once, however many calls saw it fail;
        at most once per REDIS_REPLACE_MIN_INTERVAL_S while nothing answers)."""
        now = time.monotonic()
        if self.client is not failed or now - self._replaced_at < REDIS_REPLACE_MIN_INTERVAL_S:
            return
        self._replaced_at = now
        known: list[tuple[str, int]] = []
        if self.cluster:
            with contextlib.suppress(Exception):
                known = [(node.host, int(node.port)) for node in failed.get_nodes()]
        self.client = new_client(
            self.seeds, cluster=self.cluster, timeout_s=self.timeout_s, extra_nodes=known
        )
        self.replaced += 1
        # Closing it now would break the calls still running on it.
        self._replaced_clients.add(failed)
        timer = asyncio.create_task(self._close_later(failed))
        self._timers.add(timer)
        timer.add_done_callback(self._timers.discard)

    async def _close_later(self, client: Any) -> None:
        await asyncio.sleep(REDIS_REPLACED_CLIENT_CLOSE_S)
        self._replaced_clients.discard(client)
        with contextlib.suppress(Exception):
            await client.aclose()

    async def aclose(self) -> None:
        """Close the client (unless it is the caller's) and every replaced one; idempotent."""
        for timer in list(self._timers):
            timer.cancel()
        await asyncio.gather(*self._timers, return_exceptions=True)
        clients = [*self._replaced_clients, *([self.client] if self._owns_client else [])]
        self._replaced_clients.clear()
        for client in clients:
            with contextlib.suppress(Exception):
                await client.aclose()
