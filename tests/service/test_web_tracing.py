"""ServerSpans: every route of both apps continues the `traceparent` a request carries.

Each app is served on loopback behind `ServerSpans` with a tracer provider of
the test's own (an in-memory exporter; the process's global provider stays
unset). Every route the app serves gets one request with a `traceparent`,
whatever its answer (a refusal too): its server span must be that context's
child, named by the route (docs/tracing.md#spans).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from starlette.routing import Route

from tests.support.servers import running_app
from token_finalizer import FileTokenStore
from token_finalizer.api import create_app
from token_finalizer.api.routes import router
from token_finalizer.settings import settings_from_mapping
from token_finalizer.store_server import create_store_app
from token_finalizer.web.tracing import ServerSpans

TOKEN = "shared-s3cret"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
# How long a test waits for its server spans to have ended.
SPANS_SETTLE_S = 10.0


def _routes(*routers: Any) -> list[tuple[str, str]]:
    """(method, path template) of every route the routers hold (an app's, one it includes)."""
    return sorted(
        (method, route.path)
        for router in routers
        for route in router.routes
        if isinstance(route, Route)
        for method in route.methods or ()
        if method != "HEAD"
    )


def _concrete(template: str) -> str:
    """A path the template matches: each parameter an id (`{name}`, `{name:path}`)."""
    return re.sub(r"\{[^}]+\}", "id-1", template)


def _served(
    app: Any, routes: list[tuple[str, str]]
) -> Iterator[tuple[str, InMemorySpanExporter, list[Any]]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    traced = ServerSpans(app, routes=app.router.routes, tracer_provider=provider)
    with running_app(traced) as url:
        yield url, exporter, routes


@pytest.fixture(
    scope="module",
    params=["store", "finalizer"],
)
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, InMemorySpanExporter, list[Any]]]:
    """An app behind ServerSpans, the spans it recorded, the routes it serves."""
    tmp = tmp_path_factory.mktemp(request.param)
    if request.param == "store":
        app = create_store_app(FileTokenStore(tmp / "store"), token=TOKEN)
        yield from _served(app, _routes(app.router))
    else:
        settings = settings_from_mapping(
            {"sources": {"local": {"kind": "file", "dir": str(tmp)}}}, env={}
        )
        app = create_app(settings)
        # The finalizer's own routes are an included router (api/routes.py).
        yield from _served(app, _routes(app.router, router))


def _server_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.kind is SpanKind.SERVER]


def _settled(exporter: InMemorySpanExporter, at_least: int = 0) -> list[ReadableSpan]:
    """The server spans once `at_least` have ended and no more end for a moment.

    A span ends just after its answer has gone out, on the server's thread: on a
    loaded machine the client may have read the answer (and sent the next request,
    or left the test) before it ends.
    """
    deadline = time.monotonic() + SPANS_SETTLE_S
    seen = -1
    while time.monotonic() < deadline:
        spans = _server_spans(exporter)
        if len(spans) >= at_least and len(spans) == seen:
            return spans
        seen = len(spans)
        time.sleep(0.1)
    return _server_spans(exporter)


def test_every_route_continues_the_callers_trace(
    served: tuple[str, InMemorySpanExporter, list[Any]],
) -> None:
    """One request per route, each with a traceparent: one child server span each, named."""
    url, exporter, routes = served
    _settled(exporter)  # an earlier test's last span may still be ending
    exporter.clear()
    headers = {"traceparent": TRACEPARENT, "Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        for method, template in routes:
            client.request(method, _concrete(template), content=b"{}")
    spans = _settled(exporter, at_least=len(routes))
    assert len(routes) > 3
    assert sorted(span.name for span in spans) == sorted(f"{m} {t}" for m, t in routes)
    assert {
        (f"{span.context.trace_id:032x}", f"{span.parent.span_id:016x}")
        for span in spans
        if span.parent is not None
    } == {(TRACE_ID, PARENT_ID)}
    assert all(span.parent is not None for span in spans)


def test_a_request_without_traceparent_is_a_root_span(
    served: tuple[str, InMemorySpanExporter, list[Any]],
) -> None:
    """No traceparent: the server span starts a trace of its own."""
    url, exporter, _ = served
    _settled(exporter)
    exporter.clear()
    httpx.get(f"{url}/health", timeout=30)
    (span,) = _settled(exporter, at_least=1)
    assert (span.parent, span.attributes["http.response.status_code"]) == (None, 200)


def test_a_malformed_traceparent_is_ignored(
    served: tuple[str, InMemorySpanExporter, list[Any]],
) -> None:
    """A traceparent that does not parse is dropped: the request is served, as a root span."""
    url, exporter, _ = served
    _settled(exporter)
    exporter.clear()
    answer = httpx.get(f"{url}/health", headers={"traceparent": "00-zz-yy-01"}, timeout=30)
    (span,) = _settled(exporter, at_least=1)
    assert (answer.status_code, span.parent) == (200, None)


def test_server_spans_record_no_path_query_or_header(
    served: tuple[str, InMemorySpanExporter, list[Any]],
) -> None:
    """The attributes are the method, route, status, rollout id, source and outcome only."""
    url, exporter, _ = served
    _settled(exporter)
    exporter.clear()
    httpx.get(f"{url}/health?secret=1", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    (span,) = _settled(exporter, at_least=1)
    assert set(span.attributes or {}) <= {
        "http.request.method",
        "http.route",
        "http.response.status_code",
        "token_finalizer.rollout_id",
        "token_finalizer.source",
        "token_finalizer.outcome",
    }
