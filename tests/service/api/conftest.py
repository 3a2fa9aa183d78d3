"""Fixtures of the finalizer API tests: settings over a capture directory, clients of the app.

`client` calls the app in-process (its lifespan runs around the test); use it
unless the test needs a real socket. `served_url` serves the same app under
uvicorn on loopback, for what only a real server shows (many connections at
once, raw bytes on the wire, chunked bodies arriving piece by piece).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI

from tests.support.asgi import in_process
from tests.support.captures import agent_rollout
from tests.support.redis import redis_url, unique_prefix
from tests.support.servers import running_app
from tests.support.staged_service import STAGED_RETIRE, STORE_KINDS, StagedService, staged_service
from token_finalizer import FileTokenStore
from token_finalizer.api import create_app
from token_finalizer.settings import Settings, settings_from_mapping

SettingsFactory = Callable[..., Settings]


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


@pytest.fixture
def make_settings(capture_dir: Path) -> SettingsFactory:
    """Settings with one file source `local` over `capture_dir`, plus overrides (deep-merged)."""

    def make(**overrides: Any) -> Settings:
        base = {"sources": {"default": "local", "local": {"kind": "file", "dir": str(capture_dir)}}}
        return settings_from_mapping(_merge(base, overrides), env={})

    return make


@pytest.fixture
def app(make_settings: SettingsFactory) -> FastAPI:
    """The app over the default test settings (one file source over `capture_dir`)."""
    return create_app(make_settings())


@pytest.fixture
def client(app: FastAPI) -> Iterator[httpx.Client]:
    """An in-process client of `app`; the app's lifespan runs around the test."""
    with in_process(app) as http:
        yield http


@pytest.fixture
def served_url(app: FastAPI) -> Iterator[str]:
    """The base URL of `app` served by uvicorn on loopback (for tests that need a real socket)."""
    with running_app(app) as base:
        yield base


CaptureWriter = Callable[..., list[dict[str, Any]]]


@pytest.fixture
def write_capture(file_store: FileTokenStore) -> CaptureWriter:
    """Record a single-chain agent rollout (default: into the served capture directory)."""

    def write(
        rollout_id: str,
        *,
        calls: int = 3,
        new_tokens_per_turn: int = 40,
        store: FileTokenStore | None = None,
    ) -> list[dict[str, Any]]:
        entries = agent_rollout(rollout_id, calls=calls, new_tokens_per_turn=new_tokens_per_turn)
        target = file_store if store is None else store

        async def put_all() -> None:
            for entry in entries:
                await target.put(entry)

        anyio.run(put_all)
        return entries

    return write


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A Redis key prefix of this test alone (deleted afterwards)."""
    with unique_prefix(redis_url()) as prefix:
        yield prefix


@pytest.fixture(params=STORE_KINDS)
def service(
    request: pytest.FixtureRequest, tmp_path: Path, redis_prefix: str
) -> Iterator[StagedService]:
    """The staged app (with a retire key) over a memory, a file, then a redis store."""
    directory = tmp_path / "capture"
    with staged_service(request.param, directory, redis_prefix, **STAGED_RETIRE) as opened:
        yield opened
