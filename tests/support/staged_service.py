"""The finalizer app in-process over one store holding external staging (memory, file, redis).

`staged_service(kind, directory, redis_prefix)` yields a `StagedService`:
`client` calls the app in-process (its lifespan around the block), `seed`
runs an async function with a store over the same backend as the app's
source (the very same object for memory; a store of its own over the same
directory or Redis prefix otherwise, opened and closed around the call, on
this thread's own event loop).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx

from tests.support.asgi import in_process
from tests.support.redis import redis_url
from token_finalizer import FileTokenStore, MemoryTokenStore
from token_finalizer.api import create_app
from token_finalizer.settings import settings_from_mapping
from token_finalizer.sources.redis import RedisTokenStore

__all__ = ["STAGED_RETIRE", "STORE_KINDS", "StagedService", "staged_service"]

STORE_KINDS = ("memory", "file", "redis")
# The settings that give a staged service a retire key (its answers carry tickets).
STAGED_RETIRE = {"retire": {"key": "staged-finalize-retire-key-0123456789"}}
_T = TypeVar("_T")


@dataclass
class StagedService:
    """The app's in-process client and a way to write into its store."""

    kind: str
    client: httpx.Client
    _open: Callable[[], Any]
    _shared: Any = None

    def seed(self, work: Callable[[Any], Awaitable[_T]]) -> _T:
        """Run `work(store)` on a store over the app's backend; its result."""

        async def run() -> _T:
            if self._shared is not None:
                return await work(self._shared)
            store = self._open()
            try:
                return await work(store)
            finally:
                await store.close()

        return anyio.run(run)

    def finalize(self, record: dict[str, Any], **params: str) -> dict[str, Any]:
        """POST /finalize of `record`; the answer object (the status must be 200)."""
        answer = self.client.post("/finalize", json=record, params=params)
        assert answer.status_code == 200, answer.text
        result: dict[str, Any] = answer.json()
        return result


@contextlib.contextmanager
def staged_service(
    kind: str,
    directory: Path,
    redis_prefix: str | None = None,
    *,
    source_options: dict[str, Any] | None = None,
    **settings: Any,
) -> Iterator[StagedService]:
    """The app over one source `local` of `kind` (redis: under `redis_prefix`).

    `source_options` are more keys of the source's settings (`receipt_policy`, say).
    """
    provided: dict[str, Any] = {}
    shared = None
    if kind == "memory":
        shared = MemoryTokenStore()
        provided["local"] = shared
        source: dict[str, Any] = {"kind": "memory"}
    elif kind == "file":
        source = {"kind": "file", "dir": str(directory)}
    else:
        assert redis_prefix is not None
        source = {"kind": "redis", "url": redis_url(), "key_prefix": redis_prefix}

    def open_store() -> Any:
        if kind == "file":
            return FileTokenStore(directory)
        return RedisTokenStore(redis_url(), key_prefix=redis_prefix or "")

    source.update(source_options or {})
    config = {"sources": {"default": "local", "local": source}, **settings}
    app = create_app(settings_from_mapping(config, env={}), sources=provided)
    with in_process(app) as client:
        yield StagedService(kind, client, open_store, shared)
