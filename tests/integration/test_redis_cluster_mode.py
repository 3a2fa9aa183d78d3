"""Issue 29, item 5: a Redis Cluster node given without `--redis-cluster` is refused at start.

Such a node answers PING and serves only its own slots; every other key is a
MOVED that writers retry as if the store were down. The same node named by a
finalizer's `redis` source without `cluster: true` is refused by
`token-finalizer serve` too: it would report ready and answer 503 "retry"
for every rollout; and so is the shared guard's (`guard.redis`), which would
let every finalize through uncounted.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.logs import log_lines
from tests.support.redis_processes import RedisProcess, free_ports, redis_server_available

pytestmark = pytest.mark.skipif(not redis_server_available(), reason="needs redis-server")


@pytest.fixture
def cluster_node(tmp_path: Path) -> Iterator[RedisProcess]:
    """One `redis-server --cluster-enabled yes` (no slots assigned: it still answers PING)."""
    # The bus port defaults to port + 10000, past 65535 for a high free port: name one.
    port, bus_port = free_ports(2)
    arguments = ["--cluster-enabled", "yes", "--cluster-port", str(bus_port)]
    node = RedisProcess(port, tmp_path / "node", arguments=arguments)
    node.start()
    try:
        assert node.answers()
        yield node
    finally:
        node.kill()


def test_store_serve_refuses_a_cluster_node_without_redis_cluster(
    cluster_node: RedisProcess,
) -> None:
    """Exit 2 before the port opens; one JSON error names `--redis-cluster`, `cluster: true`."""
    (port,) = free_ports(1)
    args = ["store", "serve", "--redis", cluster_node.url, "--port", str(port)]
    done = subprocess.run(
        [sys.executable, "-m", "token_finalizer.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    said = [line["message"] for line in log_lines(done.stderr)]
    errors = [message for message in said if message.startswith("error:")]
    assert done.returncode == 2
    assert len(errors) == 1 and "--redis-cluster" in errors[0] and "cluster: true" in errors[0]


def _serve(config: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`token-finalizer serve` over `config`, waited for (a refused start exits at once)."""
    path = tmp_path / "finalizer.yaml"
    path.write_text(yaml.safe_dump(config))
    (port,) = free_ports(1)
    args = ["serve", "--config", str(path), "--port", str(port)]
    return subprocess.run(
        [sys.executable, "-m", "token_finalizer.cli", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_serve_refuses_a_redis_source_on_a_cluster_node_without_cluster_true(
    cluster_node: RedisProcess, tmp_path: Path
) -> None:
    """`token-finalizer serve` exits 2, one line naming the source and `cluster: true`."""
    source = {"kind": "redis", "url": cluster_node.url}
    done = _serve({"sources": {"default": "shared", "shared": source}}, tmp_path)
    refused = [line for line in done.stderr.splitlines() if "'shared'" in line]
    assert done.returncode == 2
    assert len(refused) == 1 and "cluster: true" in refused[0]


def test_serve_refuses_a_guard_redis_on_a_cluster_node_without_cluster_true(
    cluster_node: RedisProcess, tmp_path: Path
) -> None:
    """A shared guard on such a node: exit 2, one line naming `guard.redis` and `cluster: true`."""
    config = {
        "sources": {"default": "local", "local": {"kind": "file", "dir": str(tmp_path)}},
        "token_id_capture": {"max_mask_fraction": 0.5},
        "guard": {"redis": cluster_node.url},
    }
    done = _serve(config, tmp_path)
    refused = [line for line in done.stderr.splitlines() if "guard.redis" in line]
    assert done.returncode == 2
    assert len(refused) == 1 and "cluster: true" in refused[0]
