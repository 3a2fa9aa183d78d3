"""Stores under test: the same semantic tests run against every local store kind.

`store` and `admin_store` are a memory, a file and a redis store in turn
(every store has an admin: status, inspect, rollout_ids, delete, sweep).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.redis import redis_url as find_redis_url
from tests.support.redis import unique_prefix
from token_finalizer import FileTokenStore, MemoryTokenStore
from token_finalizer.sources.redis import RedisTokenStore

STORE_KINDS = ("memory", "file", "redis")


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The URL of the test Redis (fails clearly when none answers)."""
    return find_redis_url()


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    """A plain synchronous client, to look at what the store wrote."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test alone; its keys are deleted afterwards."""
    with unique_prefix(redis_url) as prefix:
        yield prefix


def open_store(request: pytest.FixtureRequest, kind: str, directory: Path) -> Any:
    """A fresh store of `kind` (redis: under this test's own prefix)."""
    if kind == "memory":
        return MemoryTokenStore()
    if kind == "file":
        return FileTokenStore(directory)
    return RedisTokenStore(
        request.getfixturevalue("redis_url"),
        key_prefix=request.getfixturevalue("redis_prefix"),
    )


@pytest.fixture(params=STORE_KINDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """An empty memory, file, then redis store."""
    opened = open_store(request, request.param, tmp_path / "capture")
    yield opened
    await opened.close()


@pytest.fixture(params=STORE_KINDS)
async def admin_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """An empty memory, file, then redis store, for the admin tests."""
    opened = open_store(request, request.param, tmp_path / "capture")
    yield opened
    await opened.close()
