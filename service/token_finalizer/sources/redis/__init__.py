"""The redis capture store: Redis, Valkey or Redis Cluster, shared by writers and replicas.

_scripts    the Lua scripts (package resources under scripts/), read once
_clients    redis-py clients: one server, or a cluster from its seed nodes
_retrying   the one retry layer: every call retried until its deadline, then our errors
_scripting  EVALSHA, and EVALSHA + WAIT on the script's own connection
_nodes      PING every primary, SCAN every primary
_memory     Redis's memory: readings, the high-water mark, the eviction policy
_shards     each primary's replicas: can it take writes with min_replicas_acked
_client     the store's connection: key names, scripts, which scripts wait for replicas
store       RedisTokenStore: writers, freeze, drop, lineage resolution
admin       RedisStoreAdmin: status, inspect, delete, sweep, listing
staging     RedisStaging: external staging's ledger and staged calls

The shared mask-fraction guard (service/redis_guard.py) reaches its Redis
through the same layer: `RetryingRedis`, `LuaScript`, `evalsha`,
`evalsha_then_wait` and `ping_every_primary`.
"""

from __future__ import annotations

from token_finalizer.sources.redis._client import ENTRY_KEY_PARTS, KEY_PARTS, STAGING_KEY_PARTS
from token_finalizer.sources.redis._nodes import check_cluster_mode, ping_every_primary
from token_finalizer.sources.redis._retrying import RetryingRedis
from token_finalizer.sources.redis._scripting import LuaScript, evalsha, evalsha_then_wait
from token_finalizer.sources.redis._shards import (
    ShardReading,
    unwritable_message,
    unwritable_reason,
)
from token_finalizer.sources.redis.admin import RedisStoreAdmin
from token_finalizer.sources.redis.store import RedisTokenStore

__all__ = [
    "ENTRY_KEY_PARTS",
    "KEY_PARTS",
    "STAGING_KEY_PARTS",
    "LuaScript",
    "RedisStoreAdmin",
    "RedisTokenStore",
    "RetryingRedis",
    "ShardReading",
    "check_cluster_mode",
    "evalsha",
    "evalsha_then_wait",
    "ping_every_primary",
    "unwritable_message",
    "unwritable_reason",
]
