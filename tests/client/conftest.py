"""Fixtures of the client tests: a live finalizer on loopback, and both clients over it.

Most behaviours are checked through the sync and the async client alike: the
`api` fixture is parametrized over both, the async one driven from sync test
code through an event loop of its own.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.support.captures import agent_rollout
from tests.support.servers import running_app
from token_finalizer import FileTokenStore
from token_finalizer.api import create_app
from token_finalizer.settings import Settings, settings_from_mapping
from token_finalizer_client import AsyncFinalizerClient, FinalizerClient


class AsyncDriver:
    """An AsyncFinalizerClient whose coroutine methods are run to completion on each call."""

    def __init__(self, client: AsyncFinalizerClient) -> None:
        self._runner = asyncio.Runner()
        self.client = client

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.client, name)
        if inspect.iscoroutinefunction(attribute):
            return lambda *args, **kwargs: self._runner.run(attribute(*args, **kwargs))
        return attribute

    def run(self, coroutine: Any) -> Any:
        """Run any coroutine on this client's loop (for async-only methods)."""
        return self._runner.run(coroutine)

    def close(self) -> None:
        self._runner.run(self.client.close())

    def shutdown(self) -> None:
        """Close the client, then its event loop."""
        self.close()
        self._runner.close()


Connect = Callable[..., Any]


def settings_for(capture_dir: Path, other_dir: Path, **sections: Any) -> Settings:
    """Two file sources (`local`, the default, and `other`) plus extra sections."""
    return settings_from_mapping(
        {
            "sources": {
                "default": "local",
                "local": {"kind": "file", "dir": str(capture_dir)},
                "other": {"kind": "file", "dir": str(other_dir)},
            },
            **sections,
        },
        env={},
    )


@pytest.fixture(scope="module")
def capture_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The directories of the `local` and `other` sources of the module's service."""
    root = tmp_path_factory.mktemp("client-captures")
    (root / "local").mkdir()
    (root / "other").mkdir()
    return root / "local", root / "other"


@pytest.fixture(scope="module")
def service_url(capture_dirs: tuple[Path, Path]) -> Iterator[str]:
    """A finalizer service (default settings, no auth) shared by a test module."""
    with running_app(create_app(settings_for(*capture_dirs))) as base:
        yield base


@pytest.fixture(scope="module")
def local_store(capture_dirs: tuple[Path, Path]) -> FileTokenStore:
    """The `local` source's directory, opened as a store (the writer's side)."""
    return FileTokenStore(capture_dirs[0])


@pytest.fixture(scope="module")
def other_store(capture_dirs: tuple[Path, Path]) -> FileTokenStore:
    """The `other` source's directory, opened as a store."""
    return FileTokenStore(capture_dirs[1])


async def capture_rollout(
    store: FileTokenStore, *, calls: int = 3, new_tokens_per_turn: int = 40
) -> str:
    """Capture a fresh single-chain rollout in `store`; return its (unique) id."""
    rollout_id = f"r-{uuid.uuid4().hex[:12]}"
    for entry in agent_rollout(rollout_id, calls=calls, new_tokens_per_turn=new_tokens_per_turn):
        await store.put(entry)
    return rollout_id


def write_rollout(store: FileTokenStore, *, calls: int = 3, new_tokens_per_turn: int = 40) -> str:
    """`capture_rollout` from synchronous test code."""
    return anyio.run(
        functools.partial(
            capture_rollout, store, calls=calls, new_tokens_per_turn=new_tokens_per_turn
        )
    )


def mark_incomplete(store: FileTokenStore, rollout_id: str) -> None:
    """Record that one call of `rollout_id` failed to capture (its build will be masked)."""
    anyio.run(store.mark_incomplete, rollout_id, "lost-call")


@pytest.fixture(params=["sync", "async"])
def connect(request: pytest.FixtureRequest) -> Iterator[Connect]:
    """Open a client of either kind: `connect(base_url, **options)`; closed after the test."""
    opened: list[Any] = []

    def open_client(base_url: str, **options: Any) -> Any:
        if request.param == "sync":
            client: Any = FinalizerClient(base_url, **options)
        else:
            client = AsyncDriver(AsyncFinalizerClient(base_url, **options))
        opened.append(client)
        return client

    yield open_client
    for client in opened:
        if isinstance(client, AsyncDriver):
            client.shutdown()
        else:
            client.close()


@pytest.fixture
def api(connect: Connect, service_url: str) -> Any:
    """A client (sync, then async) of the module's service."""
    return connect(service_url)
