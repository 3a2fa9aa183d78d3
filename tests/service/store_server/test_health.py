"""The store server's health verdict (store_server/_health.py), on in-process stores.

A backend that hangs or raises something unexpected makes /health a 503 in
bounded time, never a 500 and never a hang; a redis store names its node.
The same over real processes: tests/integration/test_store_health.py.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.support.asgi import in_process
from token_finalizer import MemoryTokenStore
from token_finalizer.core.errors import StoreUnreachable
from token_finalizer.sources.redis import RedisTokenStore
from token_finalizer.store_server import create_store_app
from token_finalizer.store_server._health import store_health

pytestmark = pytest.mark.anyio


class _HangingStore(MemoryTokenStore):
    """A store whose ping never returns."""

    async def ping(self) -> None:
        await asyncio.Event().wait()


class _BrokenStore(MemoryTokenStore):
    """A store whose ping raises what no store should."""

    async def ping(self) -> None:
        raise KeyError("slot table")


class _DownStore(MemoryTokenStore):
    """A store whose backend is out of reach."""

    async def ping(self) -> None:
        raise StoreUnreachable("backend refused the connection")


async def test_a_store_that_answers_is_healthy() -> None:
    """200 {"status": "ok"}."""
    verdict = await store_health(MemoryTokenStore())
    assert (verdict.status_code, verdict.body) == (200, {"status": "ok"})


async def test_an_unreachable_backend_is_unhealthy_with_its_reason() -> None:
    """503 {"status": "unhealthy", "store": kind, "error": the store's message}."""
    verdict = await store_health(_DownStore())
    assert (verdict.status_code, verdict.body) == (
        503,
        {"status": "unhealthy", "store": "memory", "error": "backend refused the connection"},
    )


async def test_a_hanging_backend_is_unhealthy_within_the_deadline() -> None:
    """A ping that never returns is cut off at the deadline and reported as such."""
    verdict = await store_health(_HangingStore(), timeout_s=0.05)
    assert (verdict.status_code, verdict.body["error"]) == (
        503,
        "the memory store did not answer within 0.05s",
    )


async def test_an_unexpected_exception_is_unhealthy_not_a_crash() -> None:
    """Whatever the backend raises, /health answers 503 naming it."""
    verdict = await store_health(_BrokenStore())
    assert (verdict.status_code, verdict.body["error"]) == (503, "KeyError: 'slot table'")


async def test_a_redis_store_names_its_node() -> None:
    """A redis store nobody listens for: 503 with the DESIGN shape, naming host:port."""
    store = RedisTokenStore("redis://127.0.0.1:1/0", timeout_s=0.5)
    try:
        verdict = await store_health(store)
    finally:
        await store.close()
    redis = verdict.body["redis"]
    assert (verdict.status_code, redis["reachable"], redis["node"]) == (503, False, "127.0.0.1:1")
    assert redis["error"] == verdict.body["error"]
    assert redis["error"].startswith("redis node 127.0.0.1:1: ")


def test_the_route_answers_the_verdict() -> None:
    """GET /health over a store whose backend is down is a 503 with the verdict's body."""
    with in_process(create_store_app(_DownStore())) as client:
        answer = client.get("/health")
    assert (answer.status_code, answer.json()["status"]) == (503, "unhealthy")
