"""A primary of the cluster is down: health names it, and every caller is told to come back.

Real processes on loopback: a 3-primary cluster without replicas (a killed
primary stays down until it is started again), `store serve --redis-cluster`,
a finalizer whose source and guard are on the cluster, and one whose only
Redis is the guard's. While one primary is down:

- the store's /health is 503 naming that node;
- the first finalizer's /ready is 503 naming the source and the node, and
  reports the guard's Redis; a second one (in this process) whose only
  Redis is its guard's stays ready (the guard fails open) but reports that
  Redis as unreachable;
- a put through the store server is 503 + Retry-After: 1, a finalize through
  the direct source 503 + Retry-After: never a 500, never a masked record.

Started again, the node answers and everything is healthy.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.asgi import in_process
from tests.support.captures import make_entry, record_for
from tests.support.redis_cluster import Node, RedisCluster, needs_redis_server
from tests.support.servers import free_port, running_process
from token_finalizer.api import create_app
from token_finalizer.settings import Settings, settings_from_mapping
from token_finalizer.sources.redis import RedisTokenStore

pytestmark = needs_redis_server

TIMEOUT_S = 1.0


@dataclass
class Observed:
    """What the servers answered, before, while and after one primary was down."""

    victim: Node
    store_health: list[httpx.Response]
    ready: list[httpx.Response]
    guard_only_ready: list[httpx.Response]
    put: httpx.Response
    finalize: httpx.Response


def _finalizer_config(directory: Path, name: str, body: str) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(body)
    return path


def _guard(seeds: list[str], prefix: str) -> str:
    urls = ", ".join(f'"{seed}"' for seed in seeds)
    return f"""\
token_id_capture:
  max_mask_fraction: 0.5
guard:
  redis: {{urls: [{urls}], cluster: true}}
  key_prefix: "{prefix}guard:"
  timeout_s: {TIMEOUT_S}
"""


@contextlib.contextmanager
def _servers(cluster: RedisCluster, directory: Path, prefix: str) -> Iterator[dict[str, str]]:
    seeds = cluster.seed_urls
    urls = ", ".join(f'"{seed}"' for seed in seeds)
    direct = _finalizer_config(
        directory,
        "direct",
        f"""\
sources:
  direct:
    kind: redis
    urls: [{urls}]
    cluster: true
    key_prefix: "{prefix}"
    timeout_s: {TIMEOUT_S}
"""
        + _guard(seeds, prefix),
    )
    ports = {name: free_port() for name in ("store", "direct")}
    store_args = ["store", "serve", "--redis-cluster", "--key-prefix", prefix]
    store_args += ["--redis", seeds[0], "--redis", seeds[1], "--redis-timeout", str(TIMEOUT_S)]
    with (
        running_process([*store_args, "--port", str(ports["store"])], port=ports["store"]),
        running_process(
            ["serve", "--config", str(direct), "--port", str(ports["direct"])],
            port=ports["direct"],
        ),
    ):
        yield {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}


def _guard_only_settings(seeds: list[str], prefix: str) -> Settings:
    config = yaml.safe_load("sources:\n  local: {kind: memory}\n" + _guard(seeds, prefix))
    return settings_from_mapping(config, env={})


def _rollout_on(cluster: RedisCluster, node: Node, prefix: str) -> str:
    store = RedisTokenStore("redis://unused:1/0", key_prefix=prefix)
    return next(
        f"down-{number}"
        for number in range(100_000)
        if cluster.node_for_key(store.keys(f"down-{number}")[0]).node_id == node.node_id
    )


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    """Answers before, while and after one primary is down."""
    prefix = f"tf-health:{uuid.uuid4().hex[:8]}:"
    directory = tmp_path_factory.mktemp("cluster-health")
    with (
        RedisCluster(primaries=3, replicas=0) as cluster,
        _servers(cluster, directory, prefix) as urls,
        httpx.Client(timeout=30) as http,
        # A finalizer whose only Redis is its guard's (in this process: no source to reach).
        in_process(create_app(_guard_only_settings(cluster.seed_urls, prefix))) as guard_only_app,
    ):
        victim = cluster.primaries_now()[1]
        rollout_id = _rollout_on(cluster, victim, prefix)
        entry = make_entry(rollout_id, "c1", [1, 2], [3])
        put_url = f"{urls['store']}/ng-rollout/{rollout_id}/training-token-capture/calls/c1"
        health = [http.get(f"{urls['store']}/health")]
        ready = [http.get(f"{urls['direct']}/ready")]
        guard_only = [guard_only_app.get("/ready")]
        cluster.kill_primary(victim)
        health.append(http.get(f"{urls['store']}/health"))
        ready.append(http.get(f"{urls['direct']}/ready"))
        guard_only.append(guard_only_app.get("/ready"))
        put = http.put(put_url, json=entry)
        finalize = http.post(
            f"{urls['direct']}/finalize", params={"source": "direct"}, json=record_for(rollout_id)
        )
        cluster.restart(victim)
        health.append(http.get(f"{urls['store']}/health"))
        ready.append(http.get(f"{urls['direct']}/ready"))
        guard_only.append(guard_only_app.get("/ready"))
        yield Observed(victim, health, ready, guard_only, put, finalize)


def _statuses(answers: list[httpx.Response]) -> list[int]:
    return [answer.status_code for answer in answers]


def test_store_health_names_the_primary_that_is_down(observed: Observed) -> None:
    """/health: 200, then 503 {"redis": {"reachable": false, "node": victim}}, then 200."""
    assert _statuses(observed.store_health) == [200, 503, 200]
    body: dict[str, Any] = observed.store_health[1].json()
    node = observed.victim.address
    assert (body["status"], body["redis"]["reachable"], body["redis"]["node"]) == (
        "unhealthy",
        False,
        node,
    )
    assert body["redis"]["error"].startswith(f"redis node {node}: ")


def test_ready_names_the_source_and_the_node(observed: Observed) -> None:
    """/ready: 503 naming source `direct` and the node; the guard's Redis is reported too."""
    assert _statuses(observed.ready) == [200, 503, 200]
    body = observed.ready[1].json()
    assert body["error"] == "source(s) unreachable: direct"
    assert body["sources"]["direct"]["reachable"] is False
    assert body["sources"]["direct"]["error"].startswith(f"redis node {observed.victim.address}: ")
    assert body["guard"]["reachable"] is False
    assert observed.ready[2].json()["guard"] == {"reachable": True}


def test_the_guards_redis_never_makes_ready_fail(observed: Observed) -> None:
    """A finalizer whose only Redis is the guard's stays ready, reporting the guard down."""
    assert _statuses(observed.guard_only_ready) == [200, 200, 200]
    guard = observed.guard_only_ready[1].json()["guard"]
    assert guard["reachable"] is False
    assert guard["error"].startswith(f"redis node {observed.victim.address}: ")


def test_a_put_on_the_dead_node_is_503_with_retry_after(observed: Observed) -> None:
    """The store server retried until its deadline, then asked the writer to come back."""
    assert (observed.put.status_code, observed.put.headers.get("retry-after")) == (503, "1")


def test_a_finalize_on_the_dead_node_is_503_not_masked(observed: Observed) -> None:
    """The direct source's failure is "come back later", never a masked record."""
    assert observed.finalize.status_code == 503, observed.finalize.text
    assert "retry-after" in observed.finalize.headers
