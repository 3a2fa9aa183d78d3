"""The Redis the tests use: `$TOKEN_FINALIZER_TEST_REDIS_URL`, the local one, or a private one.

The test session (tests/conftest.py) calls `session_redis` once: when nothing
answers PING at the configured URL (the variable, or 127.0.0.1:6379), it
starts a private `redis-server` on a free loopback port (no persistence, a
temporary directory), points the variable at it for the tests and every
subprocess they start, and stops it when the session ends.

Every test gets its own key prefix and removes every key under it afterwards,
so tests never see each other's rollouts and leave nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import redis

from tests.support.servers import free_port, stop_process

__all__ = [
    "REDIS_URL_ENV_VAR",
    "answers_ping",
    "configured_redis_url",
    "delete_prefix",
    "private_redis_server",
    "redis_url",
    "session_redis",
    "store_backend",
    "unique_prefix",
]

REDIS_URL_ENV_VAR = "TOKEN_FINALIZER_TEST_REDIS_URL"
_DEFAULT_URL = "redis://127.0.0.1:6379/0"
# How long a private redis-server may take to answer its first PING.
_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 10.0


def configured_redis_url() -> str:
    """The URL the tests are told to use: the variable, else the local default."""
    return os.environ.get(REDIS_URL_ENV_VAR) or _DEFAULT_URL


def answers_ping(url: str, *, timeout: float = 1.0) -> bool:
    """Whether a Redis answers PING at `url` right now."""
    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def redis_url() -> str:
    """The test Redis; a clear failure (not a skip) when it does not answer."""
    url = configured_redis_url()
    client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise RuntimeError(
            f"the redis tests need a Redis at {url} (set {REDIS_URL_ENV_VAR}, or put "
            f"`redis-server` on PATH and the test session starts one): {exc}"
        ) from None
    finally:
        client.close()
    return url


@contextlib.contextmanager
def private_redis_server(directory: Path) -> Iterator[str]:
    """A throwaway `redis-server` on a free loopback port until the block ends; its URL.

    Nothing is persisted (no RDB snapshots, no append-only file); `directory`
    is its working directory. RuntimeError when it cannot be started.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not on PATH")
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    log = directory / "redis.log"
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    command += ["--appendonly", "no", "--dir", str(directory), "--logfile", str(log)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not answers_ping(url, timeout=0.5):
            if process.poll() is not None or time.monotonic() > deadline:
                detail = log.read_text()[-500:] if log.exists() else ""
                raise RuntimeError(f"redis-server did not start on port {port}: {detail}")
            time.sleep(0.05)
        yield url
    finally:
        stop_process(process, timeout=_STOP_TIMEOUT_S)


@contextlib.contextmanager
def session_redis() -> Iterator[str | None]:
    """The Redis of one test session: the configured one if it answers, else a private one.

    While a private server runs, `$TOKEN_FINALIZER_TEST_REDIS_URL` names it
    (subprocesses inherit it); the previous value comes back afterwards.
    None when nothing answers and `redis-server` is not installed: the tests
    that need Redis then fail, saying so.
    """
    url = configured_redis_url()
    if answers_ping(url):
        yield url
        return
    if shutil.which("redis-server") is None:
        yield None
        return
    previous = os.environ.get(REDIS_URL_ENV_VAR)
    with (
        tempfile.TemporaryDirectory(prefix="token-finalizer-test-redis-") as directory,
        private_redis_server(Path(directory)) as private_url,
    ):
        os.environ[REDIS_URL_ENV_VAR] = private_url
        try:
            yield private_url
        finally:
            if previous is None:
                os.environ.pop(REDIS_URL_ENV_VAR, None)
            else:
                os.environ[REDIS_URL_ENV_VAR] = previous


def delete_prefix(url: str, prefix: str) -> int:
    """Delete every key under `prefix`; the number deleted."""
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        return int(client.delete(*keys)) if keys else 0
    finally:
        client.close()


@contextlib.contextmanager
def unique_prefix(url: str, label: str = "test") -> Iterator[str]:
    """A key prefix no other test uses; every key under it is deleted at the end."""
    prefix = f"tf-{label}:{uuid.uuid4().hex}:"
    try:
        yield prefix
    finally:
        delete_prefix(url, prefix)


def store_backend(
    stack: contextlib.ExitStack, kind: str, directory: Path, label: str = "test"
) -> list[str]:
    """The `store serve` options of a backend: `directory` ("dir"), or a key prefix of its own
    (named after `label`) on the test Redis ("redis"), deleted when `stack` closes."""
    if kind == "dir":
        return ["--dir", str(directory)]
    prefix = stack.enter_context(unique_prefix(redis_url(), label))
    return ["--redis", redis_url(), "--key-prefix", prefix]
