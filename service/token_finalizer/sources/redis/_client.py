"""One connection to a Redis (or Valkey, or Redis Cluster) capture store, shared by the
store and its admin: the client, the rollout's key names, the scripts, and one error mapping.

Keys of rollout `R` under the configured `key_prefix` `P` all share the hash
tag `{ng:R}`, so Redis Cluster keeps one rollout on one slot:

    P{ng:R}:state        HASH   version, frozen, retired, incomplete, snapshot_id,
                                created_at, updated_at, frozen_at, retired_at
    P{ng:R}:entries      HASH   model_call_id -> the entry line as written
    P{ng:R}:digests      HASH   model_call_id -> sha256 hex of that line
    P{ng:R}:order        LIST   model_call_ids in put order (snapshots keep it)
    P{ng:R}:intents      SET    announced model_call_ids (begin_call)
    P{ng:R}:incomplete   SET    model_call_ids that failed to capture
    P{ng:R}:links        HASH   model_call_id -> its lineage link (parent, delta, lengths, digest)
    P{ng:R}:lineage      HASH   continuation fingerprint -> its candidate calls and contexts

The last two are the rollout's lineage index (docs/store-protocol.md#lineage-index),
written by the same script as the entry.

External staging (sources/redis/staging.py, docs/staging.md#storage):

    P{ng:R}:ledger         LIST   ledger rows as NeMo Gym's file ledger writes them,
                                  in commit order
    P{ng:R}:ledger_ids     HASH   model_call_id -> its first row (write-once), and
                                  "\n" + JSON [call id, reason] -> 1 per failure row
    P{ng:R}:ledger_fp      HASH   fingerprint -> the ids of its committed rows, "\n"-joined
    P{ng:R}:staged         HASH   model_call_id -> the staged call's base snapshot JSON
    P{ng:R}:staged_extras  HASH   model_call_id -> {"attachments", "extras"} JSON
    P{ng:R}:staged_index   HASH   model_call_id -> "<staging digest> <parent call id>"

Any failure of the Redis client is a SourceUnavailable (StoreUnreachable when
nothing answered): the finalizer answers 503 for it, never a masked record.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Final

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from token_finalizer._constants import (
    REDIS_CONNECT_TIMEOUT_CAP_S,
    REDIS_RETRIES,
    REDIS_RETRY_BASE_S,
    REDIS_RETRY_CAP_S,
    REDIS_SCAN_COUNT,
)
from token_finalizer.core.errors import SourceUnavailable, StoreUnreachable
from token_finalizer.core.identity import check_store_id
from token_finalizer.core.redaction import redact, redacted_url
from token_finalizer.core.store_urls import check_key_prefix, check_redis_url
from token_finalizer.sources.redis._scripts import SCRIPT_NAMES, script_source

__all__ = ["ENTRY_KEY_PARTS", "KEY_PARTS", "STAGING_KEY_PARTS", "RedisConnection", "text"]

# The order of KEYS in every script: token capture's keys (with the lineage index's
# `links` and `lineage`, docs/store-protocol.md#lineage-index), then external staging's.
ENTRY_KEY_PARTS: Final = (
    "state",
    "entries",
    "digests",
    "order",
    "intents",
    "incomplete",
    "links",
    "lineage",
)
STAGING_KEY_PARTS: Final = (
    "ledger",
    "ledger_ids",
    "ledger_fp",
    "staged",
    "staged_extras",
    "staged_index",
)
KEY_PARTS: Final = (*ENTRY_KEY_PARTS, *STAGING_KEY_PARTS)


def text(value: object) -> str:
    """A Redis reply value as str (replies are bytes: the client does not decode)."""
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisConnection:
    """The client of one redis store, its key names and its scripts.

    `url` names one server, or with `cluster=True` any node of a Redis Cluster
    (redis-py's cluster client then routes each script by its keys' slot).
    `client` may be given instead of `url` (a `redis.asyncio.Redis` or
    `RedisCluster` created by the caller, who then also owns closing it).
    """

    def __init__(
        self,
        url: str | None,
        *,
        key_prefix: str,
        timeout_s: float,
        cluster: bool = False,
        client: Any = None,
    ) -> None:
        self.key_prefix = check_key_prefix(key_prefix)
        if client is None:
            if not timeout_s > 0:
                raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
            url = check_redis_url(url)
            self.where = redacted_url(url)
            connect_s = min(timeout_s, REDIS_CONNECT_TIMEOUT_CAP_S)
            if cluster:
                # The cluster client keeps its own retries (it also follows MOVED and ASK).
                self._client: Any = RedisCluster.from_url(
                    url, socket_timeout=timeout_s, socket_connect_timeout=connect_s
                )
            else:
                backoff = ExponentialWithJitterBackoff(
                    cap=REDIS_RETRY_CAP_S, base=REDIS_RETRY_BASE_S
                )
                self._client = Redis.from_url(
                    url,
                    socket_timeout=timeout_s,
                    socket_connect_timeout=connect_s,
                    retry=Retry(backoff, REDIS_RETRIES),
                    decode_responses=False,
                )
            self._owns_client = True
        else:
            self.where = redacted_url(url) if url else type(client).__name__
            self._client = client
            self._owns_client = False
        self._closed = False
        self._scripts: dict[str, AsyncScript] = {
            name: self._client.register_script(script_source(name)) for name in SCRIPT_NAMES
        }

    def keys(self, rollout_id: str) -> list[str]:
        """The rollout's keys, in KEY_PARTS order (the id is checked first)."""
        tag = f"{self.key_prefix}{{ng:{check_store_id(rollout_id)}}}:"
        return [tag + part for part in KEY_PARTS]

    def unavailable(self, what: str, exc: BaseException) -> SourceUnavailable:
        """The error a failed Redis call raises: retryable, and naming the store."""
        # Connection trouble and timeouts mean the script never ran (or its
        # answer was lost; every script may be repeated): a retry is safe.
        unreachable = isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError)
        error = StoreUnreachable if unreachable else SourceUnavailable
        return error(
            redact(f"redis store {self.where}: {what} failed: {type(exc).__name__}: {exc}")
        )

    def unexpected(self, what: str, reply: object) -> SourceUnavailable:
        """The error of a reply no script of ours gives."""
        return SourceUnavailable(f"redis store {self.where}: {what} answered {reply!r:.200}")

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise SourceUnavailable(f"redis store {self.where} is closed ({what} refused)")

    async def run(self, script: str, rollout_id: str, args: Sequence[Any], what: str) -> Any:
        """One script over the rollout's keys; any Redis failure is SourceUnavailable."""
        keys = self.keys(rollout_id)
        self._check_open(what)
        try:
            return await self._scripts[script](keys=keys, args=list(args))
        except (RedisError, OSError) as exc:
            raise self.unavailable(f"{what} of rollout {rollout_id}", exc) from None

    async def scan_rollout_ids(self) -> AsyncIterator[str]:
        """Every rollout id with a state key under this prefix (all nodes of a cluster)."""
        self._check_open("listing rollouts")
        head, tail = f"{self.key_prefix}{{ng:", "}:state"
        try:
            async for raw in self._client.scan_iter(match=f"{head}*{tail}", count=REDIS_SCAN_COUNT):
                key = text(raw)
                yield key[len(head) : -len(tail)]
        except (RedisError, OSError) as exc:
            raise self.unavailable("listing rollouts", exc) from None

    async def ping(self) -> None:
        """Raise SourceUnavailable unless the server answers PING."""
        self._check_open("ping")
        try:
            await self._client.ping()
        except (RedisError, OSError) as exc:
            raise self.unavailable("ping", exc) from None

    async def close(self) -> None:
        """Close the connection pool (a client passed in stays the caller's); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            await self._client.aclose()
