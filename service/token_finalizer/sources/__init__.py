"""Capture stores behind one typed interface (`base`), one package or module per kind.

    memory   in-process, for tests and embedding
    file     a local directory (the embedded default; NeMo Gym compatible on disk)
    redis    Redis, Valkey or Redis Cluster, shared by writers and finalizer replicas
    http     a remote store server speaking protocol v1 (the finalizer's side only)

`open_source` opens any kind as the finalizer's CaptureSource; `open_store`
opens a local kind as a whole CaptureStore (what the store server and the
store CLI work on). See docs/store-protocol.md#the-store-interface.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from token_finalizer.sources.base import CaptureSource, CaptureStore
from token_finalizer.sources.file import FileTokenStore
from token_finalizer.sources.memory import MemoryTokenStore

if TYPE_CHECKING:
    from token_finalizer.sources.redis import RedisTokenStore

__all__ = [
    "LOCAL_KINDS",
    "SOURCE_KINDS",
    "FileTokenStore",
    "MemoryTokenStore",
    "open_source",
    "open_store",
    "redis_store_of",
]

LOCAL_KINDS = ("memory", "file", "redis")
SOURCE_KINDS = (*LOCAL_KINDS, "http")


def open_store(kind: str, **options: Any) -> CaptureStore:
    """Create the local store of one kind; options are the kind's config keys."""
    if kind == "memory":
        return MemoryTokenStore()
    if kind == "file":
        return FileTokenStore(options["dir"])
    if kind == "redis":
        # Imported lazily: only a configured redis store loads redis-py.
        from token_finalizer.sources.redis import RedisTokenStore

        return RedisTokenStore(**options)
    raise ValueError(f"unknown store kind {kind!r}; expected one of {', '.join(LOCAL_KINDS)}")


def open_source(kind: str, **options: Any) -> CaptureSource:
    """Create the finalizer's source of one configured kind; options are its config keys."""
    if kind == "http":
        # Imported lazily so the core and the local stores never load httpx.
        from token_finalizer.sources.http import HttpTokenSource

        return HttpTokenSource(**options)
    if kind in LOCAL_KINDS:
        return open_store(kind, **options)
    raise ValueError(f"unknown source kind {kind!r}; expected one of {', '.join(SOURCE_KINDS)}")


def redis_store_of(source: object) -> RedisTokenStore | None:
    """`source` when it is a redis store, else None; redis-py is loaded only for one."""
    if getattr(source, "kind", None) != "redis":
        return None
    from token_finalizer.sources.redis import RedisTokenStore

    return source if isinstance(source, RedisTokenStore) else None
