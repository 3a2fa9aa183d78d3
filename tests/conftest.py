"""Fixtures shared by every test package."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.captures import make_entry  # noqa: F401 - re-exported for tests
from token_finalizer import FileTokenStore, MemoryTokenStore


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
