"""Fixtures shared by the integration tests that run their own Redis processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.redis_cluster import RedisCluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    """Three primaries, one replica each, for the module (a module may define its own)."""
    with RedisCluster(primaries=3, replicas=1) as running:
        yield running
