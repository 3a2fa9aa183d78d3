"""Fixtures shared by every test package."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import stamina

from tests.support.captures import make_entry  # noqa: F401 - re-exported for tests
from token_finalizer import FileTokenStore, MemoryTokenStore


@pytest.fixture(autouse=True, scope="session")
def _no_retry_waits() -> Iterator[None]:
    """Retries happen as configured, minus their backoff waits (stamina's test mode).

    `cap=True` with an unreachable cap keeps every policy's own attempt count,
    so the tests still see exactly 1 + max_retries tries.
    """
    with stamina.set_testing(True, attempts=sys.maxsize, cap=True):
        yield


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio only (the service's loop)."""
    return "asyncio"


@pytest.fixture
def capture_dir(tmp_path: Path) -> Path:
    """An empty capture directory."""
    path = tmp_path / "capture"
    path.mkdir()
    return path


@pytest.fixture
def file_store(capture_dir: Path) -> FileTokenStore:
    """A file store over an empty directory."""
    return FileTokenStore(capture_dir)


@pytest.fixture
def memory_store() -> MemoryTokenStore:
    """An empty in-memory store."""
    return MemoryTokenStore()
