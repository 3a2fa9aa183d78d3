"""The finalizer and its sources' memory: /ready repeats it, an evicting source is refused.

Real processes: a private `redis-server` with a small `maxmemory`, read by a
`redis` source directly and by an `http` source through `store serve`
(docs/capacity.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.asgi import in_process
from tests.support.redis_memory import fill, limited_redis
from tests.support.redis_processes import RedisProcess, needs_redis_server
from tests.support.servers import free_port, running_process
from token_finalizer.api import create_app
from token_finalizer.cli import main
from token_finalizer.service.store_policy import start_refusals
from token_finalizer.settings import settings_from_mapping
from token_finalizer.sources.redis import RedisTokenStore

pytestmark = needs_redis_server
_PREFIX = "ready:"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisProcess]:
    with limited_redis(tmp_path) as process:
        yield process


@pytest.fixture
def store_url(server: RedisProcess) -> Iterator[str]:
    """`store serve` over the small Redis."""
    port = free_port()
    args = ["store", "serve", "--redis", server.url, "--key-prefix", _PREFIX, "--port", str(port)]
    with running_process(args, port=port):
        yield f"http://127.0.0.1:{port}"


def _ready(server: RedisProcess, store_url: str) -> tuple[int, dict[str, Any]]:
    settings = settings_from_mapping(
        {
            "sources": {
                "default": "direct",
                "direct": {"kind": "redis", "url": server.url, "key_prefix": _PREFIX},
                "remote": {"kind": "http", "url": store_url},
            }
        },
        env={},
    )
    with in_process(create_app(settings)) as client:
        answer = client.get("/ready")
    return answer.status_code, answer.json()


def _fill(server: RedisProcess) -> None:
    async def run() -> None:
        store = RedisTokenStore(server.url, key_prefix=_PREFIX)
        try:
            await fill(store)
        finally:
            await store.close()

    asyncio.run(run())


def test_ready_reports_each_sources_memory(server: RedisProcess, store_url: str) -> None:
    """Below the mark both sources are reachable, each with its memory and no status."""
    status, body = _ready(server, store_url)
    assert status == 200
    for name in ("direct", "remote"):
        assert body["sources"][name]["memory"]["max"] == 8 * 2**20
        assert "status" not in body["sources"][name]


def test_ready_repeats_memory_full_per_source(server: RedisProcess, store_url: str) -> None:
    """Past the mark /ready names memory_full for the redis and the http source, still ready."""
    _fill(server)
    for _ in range(100):  # the store server's own reading (a loaded machine may need a few)
        if httpx.get(store_url + "/health", timeout=30).json().get("status") == "memory_full":
            break
    status, body = _ready(server, store_url)
    assert (status, body["status"]) == (200, "ready")
    assert {name: probe["status"] for name, probe in body["sources"].items()} == {
        "direct": "memory_full",
        "remote": "memory_full",
    }


def test_serve_refuses_an_evicting_redis_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`token-finalizer serve` exits 2 naming the source, the policy and the fix."""
    with limited_redis(tmp_path, policy="allkeys-lru") as server:
        config = tmp_path / "config.yaml"
        config.write_text(
            yaml.safe_dump({"sources": {"shared": {"kind": "redis", "url": server.url}}})
        )
        code = main(["serve", "--config", str(config)])
    err = capsys.readouterr().err
    assert code == 2 and "'shared'" in err and "allkeys-lru" in err
    assert "CONFIG SET maxmemory-policy noeviction" in err


def test_serve_allow_eviction_passes_the_check(tmp_path: Path) -> None:
    """With allow_eviction: true the start-up check passes (the server then starts)."""
    with limited_redis(tmp_path, policy="allkeys-lru") as server:
        settings = settings_from_mapping(
            {"sources": {"shared": {"kind": "redis", "url": server.url, "allow_eviction": True}}},
            env={},
        )
        assert asyncio.run(start_refusals(settings)) == []
