"""Every client sends the caller's trace context: W3C `traceparent` on each of its requests.

A real store server and a real finalizer on loopback, each behind a layer
that notes the `traceparent` every request arrived with. The caller's span
comes from the OpenTelemetry SDK with its own provider (never the process's
global one): what counts is the span current where the client is called.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from starlette.types import ASGIApp, Receive, Scope, Send

from tests.client.conftest import settings_for
from tests.client.staged_calls import vector_records
from tests.support.captures import make_entry
from tests.support.servers import running_app
from token_finalizer import FileTokenStore
from token_finalizer.api import create_app
from token_finalizer.sources.http import HttpTokenSource as FinalizerHttpSource
from token_finalizer.store_server import create_store_app
from token_finalizer_client import (
    AsyncFinalizerClient,
    FinalizerClient,
    HttpCaptureLedger,
    HttpLineageResolver,
    HttpStagingSink,
    HttpStagingSource,
    HttpTokenSink,
    HttpTokenSource,
)
from token_finalizer_client._wire import WireRequest

CLEAN = vector_records("clean_chain")
STAGED_KEY = "rollout-clean-chain/c1"
HISTORY = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "user", "content": "and?"},
]


@dataclass
class Noted:
    """The `traceparent` of every request a server got (None: it had none)."""

    seen: list[str | None] = field(default_factory=list)

    def wrap(self, app: ASGIApp) -> ASGIApp:
        async def noting(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":  # /health too: the finalizer's /ready pings it
                headers = dict(scope.get("headers", ()))
                value = headers.get(b"traceparent")
                self.seen.append(None if value is None else value.decode())
            await app(scope, receive, send)

        return noting


@dataclass(frozen=True)
class Servers:
    store_url: str
    service_url: str
    noted: Noted


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """A store server and a finalizer, both noting the traceparent of every request."""
    root = tmp_path_factory.mktemp("tracing-clients")
    (root / "local").mkdir()
    (root / "other").mkdir()
    noted = Noted()
    store_app = noted.wrap(create_store_app(FileTokenStore(root / "store")))
    service_app = noted.wrap(create_app(settings_for(root / "local", root / "other")))
    with running_app(store_app) as store_url, running_app(service_app) as service_url:
        yield Servers(store_url, service_url, noted)


def fresh_id() -> str:
    return f"r-{uuid.uuid4().hex[:12]}"


async def _sink(servers: Servers) -> None:
    async with HttpTokenSink(url=servers.store_url) as sink:
        rollout_id = fresh_id()
        await sink.begin_call(rollout_id, "call-1")
        await sink.put(make_entry(rollout_id, "call-1", [1, 2], [3]))


async def _resolver(servers: Servers) -> None:
    async with HttpLineageResolver(url=servers.store_url) as resolver:
        await resolver.resolve(fresh_id(), HISTORY)


async def _ledger(servers: Servers) -> None:
    async with HttpCaptureLedger(servers.store_url) as ledger:
        await ledger.has_rows(fresh_id())


async def _token_source(servers: Servers) -> None:
    source = HttpTokenSource(servers.store_url)
    try:
        await source.freeze(fresh_id())
    finally:
        await source.close()


async def _finalizer_http_source(servers: Servers) -> None:
    source = FinalizerHttpSource(servers.store_url)
    try:
        await source.ping()  # what the finalizer's /ready asks the store
        await source.freeze(fresh_id())
    finally:
        await source.close()


async def _async_client(servers: Servers) -> None:
    async with AsyncFinalizerClient(servers.service_url) as client:
        await client.ready()


def _sync_client(servers: Servers) -> None:
    with FinalizerClient(servers.service_url) as client:
        client.ready()


def _staging(servers: Servers) -> None:
    with HttpStagingSink(servers.store_url) as sink:
        sink.stage(CLEAN[STAGED_KEY]["record"])
    with HttpStagingSource(servers.store_url) as source:
        source.fetch([STAGED_KEY])


CALLS: dict[str, Callable[[Servers], Any]] = {
    "HttpTokenSink": lambda servers: asyncio.run(_sink(servers)),
    "HttpLineageResolver": lambda servers: asyncio.run(_resolver(servers)),
    "HttpCaptureLedger": lambda servers: asyncio.run(_ledger(servers)),
    "HttpTokenSource": lambda servers: asyncio.run(_token_source(servers)),
    "AsyncFinalizerClient": lambda servers: asyncio.run(_async_client(servers)),
    "the finalizer's http source": lambda servers: asyncio.run(_finalizer_http_source(servers)),
    "FinalizerClient": _sync_client,
    "HttpStagingSink+Source": _staging,
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_request_carries_the_current_span(name: str, servers: Servers) -> None:
    """Called inside a span, each request the client sends names that span as its parent."""
    tracer = TracerProvider().get_tracer("test")
    servers.noted.seen.clear()
    with tracer.start_as_current_span("caller") as span:
        CALLS[name](servers)
    context = span.get_span_context()
    expected = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    assert servers.noted.seen and set(servers.noted.seen) == {expected}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_no_traceparent_outside_a_span(name: str, servers: Servers) -> None:
    """With no span current, no request carries a traceparent."""
    servers.noted.seen.clear()
    CALLS[name](servers)
    assert servers.noted.seen and set(servers.noted.seen) == {None}


def test_a_request_without_headers_stays_without_them_outside_a_trace() -> None:
    """The hot path is untouched outside a trace: a bare request has no headers of its own."""
    assert WireRequest("GET", "/health").own_headers() is None


def test_the_client_loads_no_opentelemetry_for_a_process_that_never_traces(
    tmp_path: Path,
) -> None:
    """Importing the client and building a request loads no OpenTelemetry module."""
    probe = (
        "import json, sys\n"
        "from token_finalizer_client._wire import WireRequest\n"
        "WireRequest.json('POST', '/x', {'a': 1}).own_headers()\n"
        "print(json.dumps([m for m in sys.modules if m.startswith('opentelemetry')]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"
