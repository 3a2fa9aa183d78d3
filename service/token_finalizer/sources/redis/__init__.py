"""The redis capture store: Redis, Valkey or Redis Cluster, shared by writers and replicas.

_scripts   the Lua scripts (package resources under scripts/), read once
_client    the connection: client, key names, scripts, one error mapping
store      RedisTokenStore: writers, freeze, drop, lineage resolution
admin      RedisStoreAdmin: status, inspect, delete, sweep, listing
staging    RedisStaging: external staging's ledger and staged calls
"""

from __future__ import annotations

from token_finalizer.sources.redis._client import ENTRY_KEY_PARTS, KEY_PARTS, STAGING_KEY_PARTS
from token_finalizer.sources.redis.admin import RedisStoreAdmin
from token_finalizer.sources.redis.store import RedisTokenStore

__all__ = [
    "ENTRY_KEY_PARTS",
    "KEY_PARTS",
    "STAGING_KEY_PARTS",
    "RedisStoreAdmin",
    "RedisTokenStore",
]
