"""Fixtures shared by every test package, and the Redis of the test session."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import stamina

from tests.support.captures import make_entry  # noqa: F401 - re-exported for tests
from tests.support.redis import REDIS_URL_ENV_VAR, session_redis
from token_finalizer import FileTokenStore, MemoryTokenStore

_session_redis = contextlib.ExitStack()
_redis_in_use: list[str | None] = []


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Use the Redis at $TOKEN_FINALIZER_TEST_REDIS_URL (or the local one), else start one.

    A private redis-server (free port, no persistence) is stopped when the
    session ends; tests/support/redis.py says how it is chosen.
    """
    _redis_in_use.append(_session_redis.enter_context(session_redis()))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the private redis-server, if this session started one."""
    _session_redis.close()


def _redis_line() -> str:
    url = _redis_in_use[-1] if _redis_in_use else None
    if url is None:
        return f"redis: none answers and redis-server is not on PATH (set {REDIS_URL_ENV_VAR})"
    return f"redis: {url}"


def pytest_report_header(config: pytest.Config) -> str:
    """Say which Redis the tests use (or that none answers), when the header is shown."""
    return _redis_line()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say it again in the summary, which `-q` (the suite's addopts) does not hide."""
    terminalreporter.write_line(_redis_line())


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
