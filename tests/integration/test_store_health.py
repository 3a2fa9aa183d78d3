"""The store server's /health checks its backend, and the finalizer's /ready follows it.

Real servers on loopback: a private `redis-server`, `store serve --redis` over
it as a process, a finalizer (uvicorn) with an `http` source on that store,
and a store server over a directory. When Redis dies (or the directory goes),
the store answers 503 saying why, and the finalizer's /ready goes 503 naming
the source and the store's reason.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.support.redis import private_redis_server
from tests.support.servers import free_port, running_app, running_process
from token_finalizer import FileTokenStore
from token_finalizer.api import create_app
from token_finalizer.settings import settings_from_mapping
from token_finalizer.store_server import create_store_app


@contextlib.contextmanager
def serving_store(*args: str) -> Iterator[str]:
    """`store serve ARGS` on a free port until the block ends; its URL."""
    port = free_port()
    with running_process(["store", "serve", *args, "--port", str(port)], port=port):
        yield f"http://127.0.0.1:{port}"


def serving_finalizer(store_url: str) -> contextlib.AbstractContextManager[str]:
    """A finalizer whose one source is the store at `store_url`, under uvicorn; its URL."""
    sources = {"store": {"kind": "http", "url": store_url}}
    return running_app(create_app(settings_from_mapping({"sources": sources}, env={})))


def _node(redis_url: str) -> str:
    return redis_url.removeprefix("redis://").removesuffix("/0")


def test_store_on_a_dead_redis_is_unhealthy_naming_the_node(tmp_path: Path) -> None:
    """Redis stops: /health turns 503 with {"redis": {"reachable": false, "node", "error"}}."""
    with contextlib.ExitStack() as stack:
        with private_redis_server(tmp_path) as redis_url:
            store_url = stack.enter_context(serving_store("--redis", redis_url))
            assert httpx.get(f"{store_url}/health", timeout=10).json()["status"] == "ok"
        answer = httpx.get(f"{store_url}/health", timeout=10)
    body, node = answer.json(), _node(redis_url)
    assert (answer.status_code, body["status"], body["store"]) == (503, "unhealthy", "redis")
    assert (body["redis"]["reachable"], body["redis"]["node"]) == (False, node)
    assert body["redis"]["error"].startswith(f"redis node {node}: ")
    assert body["error"] == body["redis"]["error"]


def test_finalizer_is_not_ready_while_its_store_has_lost_redis(tmp_path: Path) -> None:
    """/ready: 200 while Redis answers; 503 naming the source and the Redis node once it is gone."""
    with contextlib.ExitStack() as stack:
        with private_redis_server(tmp_path) as redis_url:
            store_url = stack.enter_context(serving_store("--redis", redis_url))
            finalizer_url = stack.enter_context(serving_finalizer(store_url))
            assert httpx.get(f"{finalizer_url}/ready", timeout=10).status_code == 200
        answer = httpx.get(f"{finalizer_url}/ready", timeout=10)
    body = answer.json()
    assert (answer.status_code, body["error"]) == (503, "source(s) unreachable: store")
    store = body["sources"]["store"]
    assert store["reachable"] is False
    assert f"/health answered HTTP 503: redis node {_node(redis_url)}: " in store["error"]


def test_store_over_a_vanished_directory_is_unhealthy(tmp_path: Path) -> None:
    """The served directory is removed: /health answers 503 {"status", "store": "file", "error"}."""
    directory = tmp_path / "captures"
    with running_app(create_store_app(FileTokenStore(directory))) as store_url:
        assert httpx.get(f"{store_url}/health", timeout=10).status_code == 200
        shutil.rmtree(directory)
        answer = httpx.get(f"{store_url}/health", timeout=10)
    assert (answer.status_code, answer.json()) == (
        503,
        {
            "status": "unhealthy",
            "store": "file",
            "error": f"capture directory {directory} is not writable",
        },
    )
