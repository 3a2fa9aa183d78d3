"""Every asyncio client works from any event loop and thread (docs/architecture.md#event-loops).

Each object is built once, then used the ways an integrator's code uses it:
`asyncio.run` per call, a Starlette `TestClient` portal (its own loop in a
thread), a hand-made loop closed without ceremony, two threads at once;
against a real store server and a real finalizer on loopback.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import uuid
import warnings
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from tests.support.captures import make_entry
from tests.support.servers import running_app
from token_finalizer import FileTokenStore
from token_finalizer.store_server import create_store_app
from token_finalizer_client import (
    AsyncFinalizerClient,
    FinalizerError,
    HttpCaptureLedger,
    HttpLineageResolver,
    HttpTokenSink,
    HttpTokenSource,
)

Use = Callable[[Any], Awaitable[object]]


@pytest.fixture(scope="module")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A store server (no tokens) over a file store."""
    store = FileTokenStore(tmp_path_factory.mktemp("any-loop-store"))
    with running_app(create_store_app(store)) as url:
        yield url


def fresh_id() -> str:
    return f"r-{uuid.uuid4().hex[:12]}"


async def use_sink(sink: HttpTokenSink) -> object:
    rid = fresh_id()
    await sink.put(make_entry(rid, "call-1", [1, 2], [3]))
    return rid


# A request with model history: only the store can say which call it continues.
HISTORY = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "and?"},
]


class LookupFailed(Exception):
    """The resolver answered without the store (it never raises; see HttpLineageResolver)."""


async def use_resolver(resolver: HttpLineageResolver) -> object:
    resolution = await resolver.resolve(fresh_id(), HISTORY)
    if resolution.reason == "lookup_error":
        raise LookupFailed(resolution.reason)
    return resolution


async def use_ledger(ledger: HttpCaptureLedger) -> object:
    return await ledger.has_rows(fresh_id())


async def use_source(source: HttpTokenSource) -> object:
    return await source.freeze(fresh_id())


async def use_client(client: AsyncFinalizerClient) -> object:
    return await client.health()


# name -> (build the object from the store's and the finalizer's URLs, one real call)
OBJECTS: dict[str, tuple[Callable[[str, str], Any], Use]] = {
    "sink": (lambda store, _: HttpTokenSink(url=store), use_sink),
    "resolver": (lambda store, _: HttpLineageResolver(url=store), use_resolver),
    "ledger": (lambda store, _: HttpCaptureLedger(store), use_ledger),
    "source": (lambda store, _: HttpTokenSource(store), use_source),
    "finalizer": (lambda _, service: AsyncFinalizerClient(service), use_client),
}


@pytest.fixture(params=sorted(OBJECTS))
def subject(
    request: pytest.FixtureRequest, store_url: str, service_url: str
) -> tuple[Any, Callable[[], Awaitable[object]]]:
    """One client object, and a coroutine function making one real call with it."""
    build, use = OBJECTS[request.param]
    obj = build(store_url, service_url)
    return obj, lambda: use(obj)


def unclosed_reports(caplog: pytest.LogCaptureFixture, caught: list[Any]) -> list[str]:
    """Every 'Unclosed ...' log record and warning seen."""
    logged = [r.getMessage() for r in caplog.records if "Unclosed" in r.getMessage()]
    warned = [str(w.message) for w in caught if "Unclosed" in str(w.message)]
    return logged + warned


def test_used_from_three_loops_in_turn(subject: tuple[Any, Any]) -> None:
    """`asyncio.run` per call, three times, then a close from a fourth loop: all succeed."""
    obj, use = subject
    results = [asyncio.run(use()) for _ in range(3)]
    asyncio.run(obj.close())
    assert all(result is not None for result in results)


def test_used_from_two_threads_at_once(subject: tuple[Any, Any]) -> None:
    """Two threads, each with its own loop, call the object concurrently without error."""
    obj, use = subject
    both_in = threading.Barrier(2)
    errors: list[BaseException] = []

    async def calls() -> None:
        both_in.wait(10)
        await asyncio.gather(use(), use())
        await use()

    def run() -> None:
        try:
            asyncio.run(calls())
        except BaseException as exc:  # reported by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    asyncio.run(obj.close())
    assert errors == []


def test_used_through_a_testclient_portal_and_directly(subject: tuple[Any, Any]) -> None:
    """A Starlette TestClient's own loop and a later `asyncio.run` both use the object."""
    obj, use = subject

    async def endpoint(request: Request) -> JSONResponse:
        await use()
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/", endpoint)])
    with TestClient(app) as client:
        assert client.get("/").json() == {"ok": True}
    asyncio.run(use())
    with TestClient(app) as client:
        assert client.get("/").status_code == 200
    asyncio.run(obj.close())


def test_no_unclosed_session_after_its_loops_closed(
    subject: tuple[Any, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """An object used from loops since closed (one by hand) reports no unclosed session."""
    obj, use = subject
    caplog.set_level(logging.ERROR)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(use())
        loop = asyncio.new_event_loop()
        loop.run_until_complete(use())
        loop.close()
        asyncio.run(use())
        del obj, use, subject, loop
        gc.collect()
    assert unclosed_reports(caplog, caught) == []


def test_calls_after_close_fail(subject: tuple[Any, Any]) -> None:
    """After `close()` every call fails, from any loop: today's semantics kept.

    A call raises FinalizerError saying it is closed; the lineage resolver,
    which never raises, answers unresolved (`lookup_error`) instead.
    """
    obj, use = subject
    asyncio.run(use())
    asyncio.run(obj.close())
    never_raises = type(obj) is HttpLineageResolver
    with pytest.raises(LookupFailed if never_raises else FinalizerError, match=r"closed|lookup"):
        asyncio.run(use())


@pytest.fixture(scope="module")
def capture_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The finalizer's two source directories (see tests/client/conftest.py)."""
    root = tmp_path_factory.mktemp("any-loop-captures")
    (root / "local").mkdir()
    (root / "other").mkdir()
    return root / "local", root / "other"
