"""A real store server on loopback over one kind of backing store: memory, file or redis.

The staging end-to-end tests run each behaviour over all three kinds; this is
the one place that builds the server for a kind.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from tests.support.redis import redis_url, unique_prefix
from tests.support.servers import running_app
from token_finalizer import FileTokenStore, MemoryTokenStore
from token_finalizer.sources.redis import RedisTokenStore
from token_finalizer.store_server import create_store_app
from token_finalizer.store_server.roles import StoreTokens

__all__ = ["STORE_KINDS", "served_store"]

STORE_KINDS = ("memory", "file", "redis")


@contextlib.contextmanager
def served_store(kind: str, directory: Path, label: str, *, tokens: StoreTokens) -> Iterator[str]:
    """The URL of a store server over a `kind` store (`directory` for file, `label` names keys)."""
    if kind == "memory":
        with running_app(create_store_app(MemoryTokenStore(), tokens=tokens)) as url:
            yield url
    elif kind == "file":
        store = FileTokenStore(directory)
        with running_app(create_store_app(store, tokens=tokens)) as url:
            yield url
    elif kind == "redis":
        server = redis_url()
        with unique_prefix(server, label) as prefix:
            redis_store = RedisTokenStore(server, key_prefix=prefix)
            with running_app(create_store_app(redis_store, tokens=tokens)) as url:
                yield url
    else:
        raise ValueError(f"no such store kind: {kind!r} (one of {', '.join(STORE_KINDS)})")
