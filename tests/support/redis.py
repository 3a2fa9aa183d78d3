"""The Redis the tests use: `$TOKEN_FINALIZER_TEST_REDIS_URL` (CI sets it), else the local one.

Every test gets its own key prefix and removes every key under it afterwards,
so tests never see each other's rollouts and leave nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import redis

__all__ = ["REDIS_URL_ENV_VAR", "delete_prefix", "redis_url", "unique_prefix"]

REDIS_URL_ENV_VAR = "TOKEN_FINALIZER_TEST_REDIS_URL"
_DEFAULT_URL = "redis://127.0.0.1:6379/0"


def redis_url() -> str:
    """The test Redis; a clear failure (not a skip) when it does not answer."""
    url = os.environ.get(REDIS_URL_ENV_VAR) or _DEFAULT_URL
    client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise RuntimeError(
            f"the redis tests need a Redis at {url} (set {REDIS_URL_ENV_VAR}): {exc}"
        ) from None
    finally:
        client.close()
    return url


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
