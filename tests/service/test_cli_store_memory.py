"""`token-finalizer store serve --redis` on a Redis with little memory (real processes).

The eviction policy is checked before the port opens; above the high-water
mark /health is 503 `memory_full`, writes answer 507 naming the memory, and
freeze and retire (what frees the store) still work (docs/capacity.md).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.redis_memory import call_entry, fill, limited_redis
from tests.support.redis_processes import RedisProcess, needs_redis_server
from tests.support.servers import free_port, running_process
from token_finalizer._constants import REDIS_MEMORY_CHECK_INTERVAL_S
from token_finalizer.cli import main
from token_finalizer.sources.http import HttpTokenSource
from token_finalizer.sources.redis import RedisTokenStore
from token_finalizer_client import HttpTokenSink, StoreFullError

pytestmark = needs_redis_server
_PREFIX = "cap:"


def _serve(server: RedisProcess, port: int, *extra: str) -> list[str]:
    args = ["store", "serve", "--redis", server.url, "--key-prefix", _PREFIX]
    return [*args, "--port", str(port), *extra]


def _fill(server: RedisProcess) -> list[str]:
    """Rollouts written straight into Redis until the mark refuses one."""

    async def run() -> list[str]:
        store = RedisTokenStore(server.url, key_prefix=_PREFIX)
        try:
            return await fill(store)
        finally:
            await store.close()

    return asyncio.run(run())


def _full(server: RedisProcess, base: str) -> list[str]:
    """`_fill`, then /health polled until the server itself reads the store as full."""
    written = _fill(server)
    for _ in range(100):  # each answer is a fresh reading: a loaded machine may need a few
        if httpx.get(base + "/health", timeout=30).json().get("status") == "memory_full":
            return written
    raise AssertionError("the store server never read its Redis as full")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisProcess]:
    with limited_redis(tmp_path) as process:
        yield process


@pytest.fixture
def served(server: RedisProcess, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """`store serve` over the small Redis; its base URL and its log file."""
    port, log = free_port(), tmp_path / "store.log"
    with running_process(_serve(server, port), port=port, log=log):
        yield f"http://127.0.0.1:{port}", log


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru"])
def test_store_serve_refuses_an_evicting_redis(tmp_path: Path, policy: str) -> None:
    """exit 2, one line naming the policy and the fix, before any port opens."""
    with limited_redis(tmp_path, policy=policy) as server:
        args = [sys.executable, "-m", "token_finalizer.cli", *_serve(server, free_port())]
        done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1
    assert policy in lines[0] and "CONFIG SET maxmemory-policy noeviction" in lines[0]


def test_store_serve_allow_eviction_starts_on_an_evicting_redis(tmp_path: Path) -> None:
    """--allow-eviction: the server starts and /health answers 200 with the memory."""
    port = free_port()
    with (
        limited_redis(tmp_path, policy="allkeys-lru") as server,
        running_process(_serve(server, port, "--allow-eviction"), port=port),
    ):
        health = httpx.get(f"http://127.0.0.1:{port}/health")
    assert health.status_code == 200 and health.json()["memory"]["max"] == 8 * 2**20


@pytest.mark.parametrize("flag", [["--memory-high-water", "0.8"], ["--allow-eviction"]])
def test_memory_options_need_redis(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: list[str]
) -> None:
    """--memory-high-water and --allow-eviction with --dir exit 2 naming the option."""
    assert main(["store", "serve", "--dir", str(tmp_path), *flag]) == 2
    assert f"{flag[0]} only goes with --redis" in capsys.readouterr().err


def test_health_reports_the_memory_below_the_mark(served: tuple[str, Path]) -> None:
    """/health is 200 with used, max, fraction and the mark."""
    health = httpx.get(served[0] + "/health")
    memory = health.json()["memory"]
    assert health.status_code == 200
    assert (memory["max"], memory["high_water"]) == (8 * 2**20, 0.9) and memory["used"] > 0


def test_health_is_memory_full_above_the_mark(
    server: RedisProcess, served: tuple[str, Path]
) -> None:
    """Past the mark /health is 503 `memory_full` with the memory."""
    _fill(server)
    health = httpx.get(served[0] + "/health")
    assert (health.status_code, health.json()["status"]) == (503, "memory_full")
    assert health.json()["memory"]["fraction"] >= 0.9


def test_a_put_above_the_mark_is_507_naming_the_memory(
    server: RedisProcess, served: tuple[str, Path]
) -> None:
    """A PUT past the mark answers 507 with `memory` beside the error."""
    _full(server, served[0])
    put = httpx.put(
        served[0] + "/ng-rollout/late/training-token-capture/calls/call-0",
        json=call_entry("late", 0),
    )
    assert put.status_code == 507
    assert put.json()["memory"]["fraction"] >= 0.9 and "high-water" in put.json()["error"]


def test_the_sink_raises_store_full_after_one_request(
    server: RedisProcess, served: tuple[str, Path]
) -> None:
    """HttpTokenSink.put raises StoreFullError, and the store saw exactly one PUT (no retry)."""
    base, log = served
    _full(server, base)

    async def put() -> StoreFullError:
        async with HttpTokenSink(url=base, timeout=10.0) as sink:
            with pytest.raises(StoreFullError) as refused:
                await sink.put(call_entry("late", 0))
        return refused.value

    error = asyncio.run(put())
    puts = [line for line in log.read_text().splitlines() if "/calls/call-0" in line]
    assert error.memory["fraction"] >= 0.9 and len(puts) == 1


def test_freeze_and_retire_work_above_the_mark_and_writes_resume(
    server: RedisProcess, served: tuple[str, Path]
) -> None:
    """Past the mark the finalizer's freezes and drops go through; then puts do again."""
    base = served[0]
    written = _full(server, base)

    async def drain_then_put() -> None:
        async with HttpTokenSource(base) as source:
            for rollout_id in written[: len(written) // 2]:
                snapshot = await source.freeze(rollout_id)
                assert len(snapshot.entries) == 4
                dropped = await source.drop(
                    rollout_id, snapshot_id=snapshot.snapshot_id, version=snapshot.version
                )
                assert dropped
        await asyncio.sleep(2 * REDIS_MEMORY_CHECK_INTERVAL_S)  # the server's reading ages out
        async with HttpTokenSink(url=base, timeout=10.0) as sink:
            await sink.put(call_entry("after", 0))

    asyncio.run(drain_then_put())
    assert httpx.get(base + "/health").status_code == 200
