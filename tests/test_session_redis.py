"""The test session's Redis (tests/support/redis.py): the configured one, else a private one.

Real `redis-server` processes on loopback: the suite must run where nothing
listens on 6379, as long as `redis-server` is installed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.redis import (
    REDIS_URL_ENV_VAR,
    answers_ping,
    private_redis_server,
    session_redis,
)
from tests.support.servers import free_port


def test_private_server_answers_until_the_block_ends(tmp_path: Path) -> None:
    """A private redis-server answers PING inside the block and is gone after it."""
    with private_redis_server(tmp_path) as url:
        assert answers_ping(url)
    assert not answers_ping(url)


def test_private_server_persists_nothing(tmp_path: Path) -> None:
    """No RDB snapshot or append-only file is left in its directory."""
    with private_redis_server(tmp_path):
        pass
    assert sorted(path.name for path in tmp_path.iterdir()) == ["redis.log"]


def test_an_answering_redis_is_used_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the configured URL answers, the session uses it and starts nothing."""
    with session_redis() as running:
        assert running is not None
        monkeypatch.setenv(REDIS_URL_ENV_VAR, running)
        with session_redis() as url:
            assert url == running


def test_a_silent_url_gets_a_private_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing at the configured URL: a private server is started, named in the variable."""
    silent = f"redis://127.0.0.1:{free_port()}/0"
    monkeypatch.setenv(REDIS_URL_ENV_VAR, silent)
    with session_redis() as url:
        assert url is not None and url != silent
        assert (answers_ping(url), os.environ[REDIS_URL_ENV_VAR]) == (True, url)
    assert (answers_ping(url), os.environ[REDIS_URL_ENV_VAR]) == (False, silent)
