"""Trace context on every request: how the client takes part in a caller's OpenTelemetry trace.

Every request of every client class is a `WireRequest` (`_wire`), and its
headers are made in one place, `WireRequest.own_headers`: there the current
trace context is added as W3C `traceparent` (and `tracestate`, and baggage,
through the propagators the process configured; `OTEL_PROPAGATORS`). So a
NeMo Gym model server's span continues through our sink's put into the
store, and a harness's through `/finalize` (docs/tracing.md).

The client never starts spans and never configures the SDK: the process that
uses it owns its tracer provider. A process that never imported OpenTelemetry
can have no current span, so nothing is imported or looked up then: the cost
is one dict lookup per request. With OpenTelemetry loaded but no span
current (the API's no-op tracer, or no trace started), it is a context
lookup and no header.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["TRACE_API_MODULE", "trace_headers"]

# Loaded by any process that starts a span (the API, or the SDK through it).
TRACE_API_MODULE = "opentelemetry.trace"


def trace_headers() -> dict[str, str] | None:
    """The headers that carry the current span's context, None when no span is current."""
    api = sys.modules.get(TRACE_API_MODULE)
    if api is None:
        return None
    current: Span = api.get_current_span()
    if not current.get_span_context().is_valid:
        return None
    # Only reached inside a trace: the propagators load once, on first use.
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier or None
