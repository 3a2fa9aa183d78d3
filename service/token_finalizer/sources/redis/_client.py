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
    P{ng:R}:sync         STRING with min_replicas_acked only: a marker written before
                                each WAIT, gone after a second (sources/redis/_scripting.py)

`links` and `lineage` are the rollout's lineage index (docs/store-protocol.md#lineage-index),
written by the same script as the entry.

External staging (sources/redis/staging.py, docs/staging.md#storage):

    P{ng:R}:ledger         LIST   ledger rows as NeMo Gym's file ledger writes them,
                                  in commit order
    P{ng:R}:ledger_ids     HASH   model_call_id -> its first row (write-once), and
                                  "\n" + JSON [call id, reason] -> 1 per failure row
    P{ng:R}:ledger_fp      HASH   fingerprint -> the ids of its committed rows, "\n"-joined
    P{ng:R}:staged         HASH   model_call_id -> the staged call's base snapshot, packed
                                  (sources/_staged_packed.py; JSON before 0.5.0)
    P{ng:R}:staged_extras  HASH   model_call_id -> {"attachments", "extras"} JSON
    P{ng:R}:staged_index   HASH   model_call_id -> "<staging digest> <parent call id>"
    P{ng:R}:staged_cleared SET    model_call_ids whose staged call a clear deleted
                                  (never staged again)

Every call goes through the retry layer (`_retrying`): whatever fails on the
way (a lost connection, a slot moving, a failover) is retried until the
store's `timeout_s` has passed, then raised as StoreUnreachable (the
finalizer and the store server answer 503 for it, never a masked record);
a request Redis refuses as such is SourceUnavailable. With
`min_replicas_acked` N, every state change is acknowledged only once N
replicas have it (WAIT on the script's own connection).
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import AsyncIterator, Sequence
from typing import Any, Final

from token_finalizer._constants import DEFAULT_MEMORY_HIGH_WATER, REDIS_SCAN_COUNT
from token_finalizer.core.errors import SourceUnavailable, StoreMemoryFull
from token_finalizer.core.identity import check_store_id
from token_finalizer.core.redaction import redacted_url
from token_finalizer.core.store_urls import check_key_prefix, check_redis_seeds
from token_finalizer.sources.redis._memory import MemoryWatch
from token_finalizer.sources.redis._nodes import (
    check_cluster_mode,
    ping_every_primary,
    scan_every_primary,
)
from token_finalizer.sources.redis._retrying import RetryingRedis
from token_finalizer.sources.redis._scripting import LuaScript, evalsha, evalsha_then_wait
from token_finalizer.sources.redis._scripts import SCRIPT_NAMES, script_source
from token_finalizer.sources.redis._shards import ShardReading, read_shards
from token_finalizer.tracing import ROLLOUT_ID, SCRIPT, child_span

__all__ = [
    "CAPTURE_WRITES",
    "ENTRY_KEY_PARTS",
    "KEY_PARTS",
    "READ_ONLY_SCRIPTS",
    "STAGING_KEY_PARTS",
    "RedisConnection",
    "text",
]

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
    "staged_cleared",
)
KEY_PARTS: Final = (*ENTRY_KEY_PARTS, *STAGING_KEY_PARTS)
# Scripts that change nothing: never followed by WAIT. Every other one is a state change.
READ_ONLY_SCRIPTS: Final = frozenset(
    {
        "committed",
        "status",
        "inspect",
        "resolve",
        "ledger_rows",
        "ledger_resolve",
        "staged_chain",
        "staged_read",
        "staging_freeze",
    }
)

# Scripts that add capture data: refused at once above the memory high-water mark
# (docs/capacity.md). Every other write frees memory or only flags (incomplete).
CAPTURE_WRITES: Final = frozenset({"put", "begin_call", "ledger_record", "ledger_failure", "stage"})


def text(value: object) -> str:
    """A Redis reply value as str (replies are bytes: the client does not decode)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _where(seeds: Sequence[str], cluster: bool) -> str:
    shown = redacted_url(seeds[0])
    if not cluster:
        return shown
    more = f" and {len(seeds) - 1} more seed(s)" if len(seeds) > 1 else ""
    return f"cluster {shown}{more}"


def _store_option(seeds: Sequence[str], cluster: bool, key_prefix: str) -> str:
    """How `token-finalizer store` names this store; credentials are never shown, so a
    password-protected server needs its password added to the URL by whoever runs it."""
    if not seeds:
        return ""
    words = ["--redis", redacted_url(seeds[0])]
    if cluster:
        words.append("--redis-cluster")
    if key_prefix:
        words += ["--key-prefix", key_prefix]
    return shlex.join(words)


class RedisConnection:
    """The client of one redis store, its key names and its scripts.

    `urls` names one server, or with `cluster=True` seed nodes of a Redis
    Cluster (any of them; the client learns the rest). `client` may be given
    instead (a `redis.asyncio.Redis` or `RedisCluster` created by the caller,
    who then also owns closing it).

    `memory_high_water` (a fraction of Redis's `maxmemory`; None: none) and
    `allow_eviction` are the store's memory rules (`memory`, a MemoryWatch).
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        key_prefix: str,
        timeout_s: float,
        cluster: bool = False,
        min_replicas_acked: int = 0,
        client: Any = None,
        memory_high_water: float | None = DEFAULT_MEMORY_HIGH_WATER,
        allow_eviction: bool = False,
    ) -> None:
        self.key_prefix = check_key_prefix(key_prefix)
        if isinstance(min_replicas_acked, bool) or min_replicas_acked < 0:
            raise ValueError(f"min_replicas_acked must be >= 0, got {min_replicas_acked!r}")
        self.min_replicas_acked = min_replicas_acked
        if client is None:
            seeds = check_redis_seeds(urls, cluster=cluster)
            self.where = _where(seeds, cluster)
        else:
            seeds = tuple(urls)
            self.where = _where(seeds, cluster) if seeds else type(client).__name__
        self.store_option = _store_option(seeds, cluster, self.key_prefix)
        self.redis = RetryingRedis(
            seeds,
            cluster=cluster,
            timeout_s=timeout_s,
            label="redis store",
            where=self.where,
            client=client,
        )
        self.memory = MemoryWatch(
            self.redis, high_water=memory_high_water, allow_eviction=allow_eviction
        )
        # What the last health check read of each primary (the store's metrics export it).
        self.last_shards: tuple[ShardReading, ...] = ()
        self._closed = False
        self._scripts = {name: LuaScript(script_source(name)) for name in SCRIPT_NAMES}

    @property
    def node(self) -> str:
        """`host:port` of the server (of a cluster: its first seed), for health reports."""
        return self.redis.node

    def keys(self, rollout_id: str) -> list[str]:
        """The rollout's keys, in KEY_PARTS order (the id is checked first)."""
        tag = f"{self.key_prefix}{{ng:{check_store_id(rollout_id)}}}:"
        return [tag + part for part in KEY_PARTS]

    def sync_key(self, rollout_id: str) -> str:
        """The rollout's WAIT marker key (see the module docstring)."""
        return f"{self.key_prefix}{{ng:{check_store_id(rollout_id)}}}:sync"

    def unexpected(self, what: str, reply: object) -> SourceUnavailable:
        """The error of a reply no script of ours gives."""
        return SourceUnavailable(f"redis store {self.where}: {what} answered {reply!r:.200}")

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise SourceUnavailable(f"redis store {self.where} is closed ({what} refused)")

    async def run(self, script: str, rollout_id: str, args: Sequence[Any], what: str) -> Any:
        """One script over the rollout's keys, retried until the deadline.

        A state change waits for `min_replicas_acked` replicas, when set.
        """
        keys = self.keys(rollout_id)
        self._check_open(what)
        if script in CAPTURE_WRITES:
            await self.memory.check_room(f"{what} of rollout {rollout_id}")
        try:
            # Under the store route's server span, one span per script call (docs/tracing.md).
            with child_span(f"redis {script}", {SCRIPT: script, ROLLOUT_ID: rollout_id}):
                return await self._run(script, keys, rollout_id, args, what)
        except StoreMemoryFull as exc:
            if exc.memory:
                raise
            # Redis's own OOM refusal: the same 507, naming the memory.
            raise await self.memory.memory_full(f"{what} of rollout {rollout_id}") from None

    async def _run(
        self, script: str, keys: list[str], rollout_id: str, args: Sequence[Any], what: str
    ) -> Any:
        lua = self._scripts[script]
        cluster = self.redis.cluster
        replicas = 0 if script in READ_ONLY_SCRIPTS else self.min_replicas_acked
        if not replicas:
            return await self.redis.call(
                f"{what} of rollout {rollout_id}",
                lambda client: evalsha(client, lua, keys, args, cluster=cluster),
            )
        deadline = asyncio.get_running_loop().time() + self.redis.timeout_s
        sync_key = self.sync_key(rollout_id)

        async def step(client: Any) -> Any:
            return await evalsha_then_wait(
                client,
                lua,
                keys,
                args,
                cluster=cluster,
                replicas=replicas,
                deadline=deadline,
                sync_key=sync_key,
            )

        return await self.redis.call(f"{what} of rollout {rollout_id}", step)

    async def scan_rollout_ids(self) -> AsyncIterator[str]:
        """Every rollout id with a state key under this prefix (every primary of a cluster)."""
        self._check_open("listing rollouts")
        head, tail = f"{self.key_prefix}{{ng:", "}:state"
        async for raw in scan_every_primary(self.redis, f"{head}*{tail}", REDIS_SCAN_COUNT):
            key = text(raw)
            yield key[len(head) : -len(tail)]

    async def ping(self) -> None:
        """Return when the server (every primary of a cluster) answers PING.

        Raises StoreNodeUnreachable naming the node that does not.
        """
        self._check_open("ping")
        await ping_every_primary(self.redis)

    async def shards(self) -> tuple[ShardReading, ...]:
        """Each primary's reach and replicas: a cluster's, or the one server's with
        `min_replicas_acked`; () for a plain server without it (nothing to say)."""
        self._check_open("shard check")
        if not self.redis.cluster and not self.min_replicas_acked:
            return ()
        self.last_shards = await read_shards(self.redis, self.min_replicas_acked)
        return self.last_shards

    async def check_cluster_mode(self) -> None:
        """ClusterModeRefused when a server given as one Redis is a cluster node (at start)."""
        self._check_open("cluster mode check")
        await check_cluster_mode(self.redis)

    async def close(self) -> None:
        """Close the connection pool (a client passed in stays the caller's); idempotent."""
        if self._closed:
            return
        self._closed = True
        await self.redis.aclose()
