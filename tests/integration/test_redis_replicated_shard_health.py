"""One Redis (no cluster) with `--min-replicas-acked 1`: its replica gone, /health says so.

Real processes on loopback: a primary with one replica and `store serve
--redis URL --min-replicas-acked 1`. The replica is killed (the primary
drops its link at once) and started again: /health is 200, then 503
`shard_unwritable` naming the primary, then 200; `shard_writable` and
`shard_replicas` follow (docs/store-protocol.md#health). A plain server
knows no list of its replicas, so none is named missing: the count is said.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.redis_cluster import needs_redis_server
from tests.support.redis_replicated import ReplicatedRedis
from tests.support.servers import free_port, running_process

pytestmark = needs_redis_server

AUTH = {"Authorization": "Bearer t-one"}
SETTLE_S = 30.0
_POLL_S = 0.2


@dataclass
class Seen:
    """The store's /health answer and its shard gauges at one moment."""

    health: httpx.Response
    gauges: dict[str, float]


def _seen(http: httpx.Client, base: str) -> Seen:
    health = http.get(f"{base}/health")
    metrics = http.get(f"{base}/metrics", headers=AUTH)
    assert metrics.status_code == 200
    gauges = {
        sample.name: sample.value
        for family in text_string_to_metric_families(metrics.text)
        for sample in family.samples
        if sample.name.startswith("token_finalizer_store_shard_")
    }
    return Seen(health, gauges)


def _settled(http: httpx.Client, base: str, status: int) -> Seen:
    """The first answer with `status` within SETTLE_S (else the last one)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        seen = _seen(http, base)
        if seen.health.status_code == status or time.monotonic() > deadline:
            return seen
        time.sleep(_POLL_S)


@pytest.fixture(scope="module")
def observed() -> Iterator[tuple[str, list[Seen]]]:
    """The primary's address, and what the store said before, while and after its replica died."""
    prefix = f"tf-one-shard:{uuid.uuid4().hex[:8]}:"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with ReplicatedRedis(replica_count=1) as servers:
        args = ["store", "serve", "--redis", servers.url, "--key-prefix", prefix]
        args += ["--min-replicas-acked", "1", "--redis-timeout", "1", "--token", "t-one"]
        with running_process([*args, "--port", str(port)], port=port), httpx.Client() as http:
            (replica,) = servers.replicas
            answers = [_settled(http, base, 200)]
            servers.kill(replica)
            answers.append(_settled(http, base, 503))
            servers.restart(replica)
            answers.append(_settled(http, base, 200))
        assert servers.primary is not None
        yield servers.primary.address, answers


def test_health_flips_with_the_replica(observed: tuple[str, list[Seen]]) -> None:
    """/health: 200 with the replica, 503 without it, 200 once it is back in sync."""
    _, answers = observed
    assert [seen.health.status_code for seen in answers] == [200, 503, 200]


def test_the_refusal_names_the_primary_and_the_count(observed: tuple[str, list[Seen]]) -> None:
    """Without its replica: shard_unwritable, naming the primary and 0 of the 1 replica needed."""
    primary, answers = observed
    body = answers[1].health.json()
    assert body["status"] == "shard_unwritable"
    assert body["error"].startswith(
        f"redis shard {primary} cannot take writes: 0 of the 1 connected replica(s)"
    )


def test_gauges_follow_the_replica(observed: tuple[str, list[Seen]]) -> None:
    """shard_writable 1, 0, 1 and shard_replicas 1, 0, 1 for the one primary."""
    _, answers = observed
    writable = [seen.gauges["token_finalizer_store_shard_writable"] for seen in answers]
    replicas = [seen.gauges["token_finalizer_store_shard_replicas"] for seen in answers]
    assert (writable, replicas) == ([1.0, 0.0, 1.0], [1.0, 0.0, 1.0])
