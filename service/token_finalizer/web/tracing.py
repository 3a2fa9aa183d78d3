"""Server spans of both apps: every request continues the caller's W3C trace context.

`install_tracing(app, service_name)` is the one hook each app factory calls,
last, so the span covers every other middleware (the bearer check, the
access log) and the route. It sets up the SDK from `OTEL_*` when asked
(`token_finalizer.tracing`) and adds `ServerSpans` only when spans are
recorded in this process: off, the app has no extra layer at all.

A server span is named `METHOD route` (`POST /finalize`,
`PUT /rollouts/{rollout_id}/calls/{model_call_id:path}`), is a child of the
`traceparent` the request carried (a root without one), and records the
method, the route, the status, and the rollout id, source and outcome the
route knew (`access_log.log_fields`, the path's `rollout_id`); never a
header, a query, a body or a token id. See docs/tracing.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from fastapi.routing import APIRoute
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from token_finalizer.tracing import (
    OUTCOME,
    ROLLOUT_ID,
    SOURCE,
    TRACER_NAME,
    configure_tracing,
    mark_failed,
)
from token_finalizer.web.access_log import request_log_fields

__all__ = ["ServerSpans", "install_tracing"]

# The propagation headers read from a request (the W3C trace context and baggage).
_CONTEXT_HEADERS: Final = frozenset({b"traceparent", b"tracestate", b"baggage"})
# Longest rollout id recorded as an attribute (ids are short; a hostile path is not).
_MAX_ATTRIBUTE_CHARS: Final = 256


# FastAPI's own telemetry (its versions from 0.165 trace, count and log natively once
# a provider is set, and export by themselves with FASTAPI_OTEL_AUTO_CONFIGURE) is
# turned off, every signal of it: our spans name the same requests with our attributes
# only; its metrics would duplicate /metrics; its log records carry exception texts and
# validation inputs, which may quote token ids. All off, its per-request check is three dict
# lookups. Older versions keep the unknown argument in `app.extra`, unused.
FASTAPI_TELEMETRY: Final[Any] = {
    "tracing": False,
    "operation_spans": False,
    "metrics": False,
    "logs": False,
    "auto_configure": False,
}


def install_tracing(app: Any, service_name: str) -> None:
    """Add `ServerSpans` to `app` when this process records spans (set up from OTEL_* first)."""
    if configure_tracing(service_name):
        app.add_middleware(ServerSpans, routes=app.router.routes)


def _outcome(status: int) -> str:
    """A route's outcome when it named none: what its status says."""
    if status < 400:
        return "ok"
    return "refused" if status < 500 else "error"


def _clipped(value: object) -> str:
    return str(value)[:_MAX_ATTRIBUTE_CHARS]


class ServerSpans:
    """Pure ASGI middleware: one SERVER span per HTTP request, current while it is served."""

    def __init__(
        self, app: ASGIApp, routes: Sequence[BaseRoute] = (), tracer_provider: Any = None
    ) -> None:
        """`routes` name the spans; `tracer_provider` is the global one unless given."""
        from opentelemetry import propagate, trace

        self.app = app
        self._routes = routes
        self._templates: dict[Any, str] | None = None
        self._tracer = trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)
        self._extract = propagate.extract
        self._server_kind = trace.SpanKind.SERVER

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope.get("headers", ())
            if name in _CONTEXT_HEADERS
        }
        method = scope.get("method", "")
        status = 500

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        with self._tracer.start_as_current_span(
            method,
            context=self._extract(carrier) if carrier else None,
            kind=self._server_kind,
            attributes={"http.request.method": method},
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                await self.app(scope, receive, send_and_note)
            except BaseException as exc:
                mark_failed(span, exc)
                raise
            finally:
                _describe(span, scope, method, status, self._template(scope))

    def _template(self, scope: Scope) -> str | None:
        """The path template of the route that served `scope` (None: no route did)."""
        template = getattr(scope.get("route"), "path", None)
        if template is not None:
            return str(template)
        # FastAPI's router does not name a plain Starlette route in the scope: its
        # endpoint does (the store's hot routes, store_server/app.py).
        if self._templates is None:
            self._templates = {
                route.endpoint: route.path
                for route in self._routes
                if isinstance(route, Route | APIRoute)
            }
        endpoint = scope.get("endpoint")
        try:
            return None if endpoint is None else self._templates.get(endpoint)
        except TypeError:  # an endpoint that cannot be a key
            return None


def _describe(span: Any, scope: Scope, method: str, status: int, template: str | None) -> None:
    """Name the span by its route and record what the request came to (one attribute update)."""
    attributes: dict[str, str | int] = {"http.response.status_code": status}
    if template is not None:
        span.update_name(f"{method} {template}")
        attributes["http.route"] = template
    fields = request_log_fields(scope)
    rollout_id = fields.get("rollout_id") or scope.get("path_params", {}).get("rollout_id")
    if rollout_id:
        attributes[ROLLOUT_ID] = _clipped(rollout_id)
    if fields.get("source"):
        attributes[SOURCE] = _clipped(fields["source"])
    attributes[OUTCOME] = _clipped(fields.get("outcome") or _outcome(status))
    span.set_attributes(attributes)
    if status >= 500:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
