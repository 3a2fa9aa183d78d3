"""Capture stores behind the TokenSource protocol, one module per kind.

memory   in-process, for tests and embedding
file     a local directory (the embedded default; NeMo Gym compatible on disk)
http     a remote capture store speaking protocol v1, through httpx
redis    Redis, Valkey or Redis Cluster, shared by writers and finalizer replicas
"""

from __future__ import annotations

from typing import Any

from token_finalizer.core.protocols import TokenSource
from token_finalizer.sources.file import FileTokenStore, SweptCapture
from token_finalizer.sources.memory import MemoryTokenStore

__all__ = ["SOURCE_KINDS", "FileTokenStore", "MemoryTokenStore", "SweptCapture", "open_source"]

SOURCE_KINDS = ("memory", "file", "http", "redis")


def open_source(kind: str, **options: Any) -> TokenSource:
    """Create the source of one configured kind; options are the kind's config keys."""
    if kind == "memory":
        return MemoryTokenStore()
    if kind == "file":
        return FileTokenStore(options["dir"])
    if kind == "http":
        # Imported lazily so the core and the local stores never load httpx.
        from token_finalizer.sources.http import HttpTokenSource

        return HttpTokenSource(**options)
    if kind == "redis":
        # Imported lazily, like httpx: only a configured redis source loads redis-py.
        from token_finalizer.sources.redis import RedisTokenStore

        return RedisTokenStore(**options)
    raise ValueError(f"unknown source kind {kind!r}; expected one of {', '.join(SOURCE_KINDS)}")
