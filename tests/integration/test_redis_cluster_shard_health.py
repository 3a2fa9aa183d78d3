"""A cluster primary that lost its replica cannot take writes: health names it, and back.

Real processes on loopback: a 3 x 1 Redis Cluster, `store serve
--redis-cluster --min-replicas-acked 1`, and a finalizer with two sources on
the cluster, `direct` (kind redis, `min_replicas_acked: 1`) and `store` (kind
http, through that store server). One primary's only replica is killed
(SIGKILL: the primary drops its link at once, the cluster still lists the
replica) and then started again. While it is down:

- the store's /health is 503 `shard_unwritable` naming the primary and the
  missing replica, and its /metrics has `shard_writable{node=primary} 0`;
- the finalizer's /ready is 503 for both sources, each error naming them,
  and its /metrics has `source_shard_writable{source=direct, node=primary} 0`.

Once the replica is back in sync, all of it is healthy again
(docs/store-protocol.md#health, docs/finalizer-api.md#health-readiness-metrics).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.redis_cluster import Node, RedisCluster, needs_redis_server
from tests.support.servers import free_port, running_process

pytestmark = needs_redis_server

TOKEN = "t-shards"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TIMEOUT_S = 1.0
# How long the primary may take to notice its replica's death, or the restarted
# replica to be counted online again (a busy 2-core machine).
SETTLE_S = 30.0
_POLL_S = 0.2
WRITABLE = "token_finalizer_store_shard_writable"
SOURCE_WRITABLE = "token_finalizer_source_shard_writable"


@dataclass
class Snapshot:
    """What the servers answered at one moment."""

    health: httpx.Response
    ready: httpx.Response
    # shard_writable by node: the store's, and the finalizer's for source `direct`.
    writable: dict[str, float]
    direct_writable: dict[str, float]


@dataclass
class Observed:
    """The primary, its replica, and the answers before, while and after the replica was down."""

    primary: Node
    replica: Node
    before: Snapshot
    during: Snapshot
    after: Snapshot


@contextlib.contextmanager
def _servers(cluster: RedisCluster, directory: Path) -> Iterator[dict[str, str]]:
    prefix = f"tf-shards:{uuid.uuid4().hex[:8]}:"
    seeds = cluster.seed_urls
    ports = {name: free_port() for name in ("store", "finalizer")}
    store_url = f"http://127.0.0.1:{ports['store']}"
    urls = ", ".join(f'"{seed}"' for seed in seeds)
    config = directory / "finalizer.yaml"
    config.write_text(
        f"""\
sources:
  default: direct
  direct:
    kind: redis
    urls: [{urls}]
    cluster: true
    key_prefix: "{prefix}"
    timeout_s: {TIMEOUT_S}
    min_replicas_acked: 1
  store: {{kind: http, url: "{store_url}", token: "{TOKEN}"}}
"""
    )
    store = ["store", "serve", "--redis-cluster", "--redis", seeds[0], "--key-prefix", prefix]
    store += ["--min-replicas-acked", "1", "--redis-timeout", str(TIMEOUT_S), "--token", TOKEN]
    with (
        running_process([*store, "--port", str(ports["store"])], port=ports["store"]),
        running_process(
            ["serve", "--config", str(config), "--port", str(ports["finalizer"])],
            port=ports["finalizer"],
        ),
    ):
        yield {"store": store_url, "finalizer": f"http://127.0.0.1:{ports['finalizer']}"}


def _snapshot(http: httpx.Client, urls: dict[str, str]) -> Snapshot:
    health = http.get(f"{urls['store']}/health")
    ready = http.get(f"{urls['finalizer']}/ready")
    return Snapshot(
        health,
        ready,
        _by_node(http.get(f"{urls['store']}/metrics", headers=AUTH), WRITABLE),
        _by_node(http.get(f"{urls['finalizer']}/metrics"), SOURCE_WRITABLE, source="direct"),
    )


def _by_node(answer: httpx.Response, metric: str, **labels: str) -> dict[str, float]:
    assert answer.status_code == 200
    return {
        sample.labels["node"]: sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
        if sample.name == metric and all(sample.labels.get(k) == v for k, v in labels.items())
    }


def _settled(take: Callable[[], Snapshot], done: Callable[[Snapshot], bool]) -> Snapshot:
    """The first snapshot for which `done` holds, within SETTLE_S (else the last one)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        snapshot = take()
        if done(snapshot) or time.monotonic() > deadline:
            return snapshot
        time.sleep(_POLL_S)


def _both(status: int) -> Callable[[Snapshot], bool]:
    return lambda seen: seen.health.status_code == seen.ready.status_code == status


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    """The answers with every replica up, with one primary's replica killed, and restarted."""
    directory = tmp_path_factory.mktemp("shard-health")
    with (
        RedisCluster(primaries=3, replicas=1) as cluster,
        _servers(cluster, directory) as urls,
        httpx.Client(timeout=30) as http,
    ):
        primary = cluster.primaries_now()[1]
        (replica,) = cluster.replicas_of(primary)

        def take() -> Snapshot:
            return _snapshot(http, urls)

        before = _settled(take, _both(200))
        cluster.kill(replica)
        during = _settled(take, _both(503))
        cluster.restart(replica)
        after = _settled(take, _both(200))
        yield Observed(primary, replica, before, during, after)


def test_store_health_is_ok_with_every_replica(observed: Observed) -> None:
    """Before: the store's /health is 200 and lists the primary writable with its replica."""
    assert observed.before.health.status_code == 200
    shards = {shard["node"]: shard for shard in observed.before.health.json()["shards"]}
    shown = shards[observed.primary.address]
    assert (shown["writable"], shown["replicas"]) == (True, [observed.replica.address])


def test_store_health_names_the_primary_and_its_missing_replica(observed: Observed) -> None:
    """During: /health is 503 shard_unwritable, its error naming the primary and the replica."""
    answer = observed.during.health
    assert answer.status_code == 503, answer.text
    body = answer.json()
    assert body["status"] == "shard_unwritable"
    assert f"redis shard {observed.primary.address} cannot take writes" in body["error"]
    assert f"(missing: {observed.replica.address})" in body["error"]
    shards = {shard["node"]: shard for shard in body["shards"]}
    assert shards[observed.primary.address]["missing_replicas"] == [observed.replica.address]


def test_only_the_stuck_primary_is_named(observed: Observed) -> None:
    """During: the other primaries stay writable, in /health and in the metric."""
    body = observed.during.health.json()
    stuck = [shard["node"] for shard in body["shards"] if not shard["writable"]]
    assert stuck == [observed.primary.address]
    assert [node for node, value in observed.during.writable.items() if value == 0] == stuck


def test_metric_shows_the_shard_unwritable_and_back(observed: Observed) -> None:
    """shard_writable{node=primary}: 1, then 0 while its replica is down, then 1."""
    node = observed.primary.address
    seen = [snapshot.writable.get(node) for snapshot in (observed.before, observed.during)]
    assert [*seen, observed.after.writable.get(node)] == [1.0, 0.0, 1.0]


def test_finalizer_metric_shows_the_shard_unwritable_and_back(observed: Observed) -> None:
    """The finalizer's source_shard_writable{source=direct, node=primary}: 1, 0, then 1."""
    node = observed.primary.address
    snapshots = (observed.before, observed.during, observed.after)
    assert [snapshot.direct_writable.get(node) for snapshot in snapshots] == [1.0, 0.0, 1.0]


def test_ready_is_503_naming_the_shard_for_each_source(observed: Observed) -> None:
    """During: /ready is 503; the redis source and the http source each name the shard."""
    answer = observed.during.ready
    assert answer.status_code == 503, answer.text
    sources = answer.json()["sources"]
    for name in ("direct", "store"):
        assert observed.primary.address in sources[name]["error"], name
        assert observed.replica.address in sources[name]["error"], name
    assert sources["direct"]["status"] == "shard_unwritable"


def test_everything_recovers_with_the_replica(observed: Observed) -> None:
    """After the replica is back in sync, /health and /ready are 200 again."""
    assert observed.after.health.status_code == 200, observed.after.health.text
    assert observed.after.ready.status_code == 200, observed.after.ready.text
