"""Issue 29, item 5: a Redis Cluster node given without `--redis-cluster` is refused at start.

Such a node answers PING and serves only its own slots; every other key is a
MOVED that writers retry as if the store were down.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

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
