"""`store serve --workers N`: each worker process opens the store and serves it.

The parent hands the chosen backend and tokens to the workers in one
environment variable (`WORKER_SPEC_ENV_VAR`, JSON; the workers are its own
children and the tokens may already come from the environment) and uvicorn
starts them on `worker_app`. Each worker opens its own store at start-up
(checked reachable: a worker that cannot reach it fails its start) and
closes it at shutdown. Their metrics are summed through
PROMETHEUS_MULTIPROC_DIR (token_finalizer/_prometheus.py).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson

from token_finalizer.cli.store.backend import Backend, opened
from token_finalizer.store_server.roles import StoreTokens

__all__ = ["WORKER_SPEC_ENV_VAR", "worker_app", "worker_spec"]

WORKER_SPEC_ENV_VAR = "TOKEN_FINALIZER_STORE_WORKER_SPEC"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def worker_spec(backend: Backend, tokens: StoreTokens) -> str:
    """The JSON the workers rebuild the backend and the tokens from."""
    options = {key: str(value) if isinstance(value, Path) else value
               for key, value in backend.options.items()}  # fmt: skip
    spec = {"kind": backend.kind, "where": backend.where, "options": options}
    return orjson.dumps({**spec, "tokens": asdict(tokens)}).decode()


def _from_spec(text: str) -> tuple[Backend, StoreTokens]:
    spec = orjson.loads(text)
    tokens = StoreTokens(**{role: tuple(held) for role, held in spec["tokens"].items()})
    return Backend(spec["kind"], spec["where"], spec["options"]), tokens


class _StoreWorker:
    """ASGI app of one worker: opens the store on lifespan start-up, then serves it."""

    def __init__(self, backend: Backend, tokens: StoreTokens) -> None:
        self._backend = backend
        self._tokens = tokens
        self._app: ASGIApp | None = None
        self._stack = contextlib.AsyncExitStack()

    async def _start(self) -> None:
        from token_finalizer.store_server import create_store_app

        store = await self._stack.enter_async_context(opened(self._backend))
        await store.ping()
        self._app = create_store_app(store, tokens=self._tokens)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self._start()
                except Exception as exc:
                    await self._stack.aclose()
                    error = f"the store {self._backend.where} cannot be opened: {exc}"
                    await send({"type": "lifespan.startup.failed", "message": error})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self._stack.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if self._app is None:  # only before start-up completed
            raise RuntimeError("the store worker has not started")
        await self._app(scope, receive, send)


def worker_app() -> ASGIApp:
    """uvicorn's factory in each worker: the store of `WORKER_SPEC_ENV_VAR`, served."""
    backend, tokens = _from_spec(os.environ[WORKER_SPEC_ENV_VAR])
    return _StoreWorker(backend, tokens)
