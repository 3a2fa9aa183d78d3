"""OpenTelemetry tracing of both servers: the SDK set up from `OTEL_*`, and the spans we start.

Off unless the environment asks for it (docs/tracing.md): tracing is on in a
server process when `OTEL_TRACES_EXPORTER` names an exporter (not `none`), or
an OTLP endpoint is set (`OTEL_EXPORTER_OTLP_ENDPOINT`,
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), and `OTEL_SDK_DISABLED` is not true.
Then `configure_tracing` installs the SDK's tracer provider with a batch
processor per exporter; everything else (service name, resource attributes,
sampler, batch sizes, the exporter's endpoint, headers and timeout) is the
SDK's own reading of the standard variables. The SDK and the OTLP exporter
are the optional extra `token-finalizer[otel]`; without them a request for
tracing is logged once and ignored.

Off, nothing here imports OpenTelemetry: `child_span` finds no trace API
loaded and hands back one shared null context, so the hot path pays a dict
lookup per span it would have started. A program that embeds the apps and
sets its own tracer provider gets the same spans without any variable
(`tracing_active`).

The spans carry the rollout id, the source and the outcome, never token ids,
bodies or headers (`ATTRIBUTES`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Final

from token_finalizer_client.transport import TRACE_API_MODULE

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

__all__ = [
    "OUTCOME",
    "ROLLOUT_ID",
    "SCRIPT",
    "SOURCE",
    "TRACER_NAME",
    "child_span",
    "configure_tracing",
    "mark_failed",
    "tracing_active",
    "tracing_requested",
]

logger = logging.getLogger(__name__)

TRACER_NAME: Final = "token_finalizer"
# The span attributes we set (docs/tracing.md#spans); nothing else of a request is recorded.
ROLLOUT_ID: Final = "token_finalizer.rollout_id"
SOURCE: Final = "token_finalizer.source"
OUTCOME: Final = "token_finalizer.outcome"
SCRIPT: Final = "token_finalizer.redis.script"

_EXPORTER_ENV: Final = "OTEL_TRACES_EXPORTER"
_ENDPOINT_ENVS: Final = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_DISABLED_ENV: Final = "OTEL_SDK_DISABLED"

_state: dict[str, bool] = {}  # "configured": this process installed its provider


def tracing_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the `OTEL_*` variables ask this process to export traces."""
    env = os.environ if environ is None else environ
    if env.get(_DISABLED_ENV, "").strip().lower() == "true":
        return False
    exporters = _exporters(env)
    if exporters is not None:
        return bool(exporters)
    return any(env.get(name, "").strip() for name in _ENDPOINT_ENVS)


def _exporters(env: Mapping[str, str]) -> list[str] | None:
    """The exporter names `OTEL_TRACES_EXPORTER` lists ([] for `none`), None when it is unset."""
    value = env.get(_EXPORTER_ENV, "").strip().lower()
    if not value:
        return None
    names = [name.strip() for name in value.split(",") if name.strip()]
    return [] if "none" in names else names


def configure_tracing(service_name: str) -> bool:
    """Install the SDK's tracer provider once per process when asked; whether tracing is on.

    `service_name` is the default of `OTEL_SERVICE_NAME` (and of a
    `service.name` in `OTEL_RESOURCE_ATTRIBUTES`). Each server's factory
    calls this; a worker process sets up its own provider.
    """
    if _state.get("configured"):
        return True
    if not tracing_requested():
        return tracing_active()
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        logger.warning(
            "OTEL_* asks for traces but the OpenTelemetry SDK is not installed: "
            "tracing stays off (install token-finalizer[otel]; docs/tracing.md)"
        )
        return False
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    provider = TracerProvider(resource=resource)
    for exporter in _span_exporters(_exporters(os.environ) or ["otlp"]):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _state["configured"] = True
    logger.info("tracing on: spans exported by %s", ", ".join(_exporters(os.environ) or ["otlp"]))
    return True


def _span_exporters(names: list[str]) -> Iterator[SpanExporter]:
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    for name in names:
        if name == "otlp":
            protocol = os.environ.get(
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            )
            if protocol not in (None, "", "http/protobuf"):
                logger.warning("OTLP protocol %r is not shipped; exporting http/protobuf", protocol)
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            yield OTLPSpanExporter()
        elif name == "console":
            yield ConsoleSpanExporter()
        else:
            logger.warning("trace exporter %r is not available; skipped (docs/tracing.md)", name)


def tracing_active() -> bool:
    """Whether spans started here are recorded: an SDK provider is set in this process.

    True after `configure_tracing` set one, or when the embedding program set
    its own; the API's default (proxy) provider records nothing.
    """
    if _state.get("configured"):
        return True
    api = sys.modules.get(TRACE_API_MODULE)
    if api is None:
        return False
    provider = api.get_tracer_provider()
    return not isinstance(provider, api.ProxyTracerProvider | api.NoOpTracerProvider)


_NO_SPAN: Final = contextlib.nullcontext(None)


def child_span(
    name: str, attributes: Mapping[str, str] | None = None
) -> contextlib.AbstractContextManager[Span | None]:
    """A span under the current one, made current for the block; none outside a recorded trace.

    A child only: work outside a request's server span (a sweep, a batch
    command) starts no trace of its own.
    """
    api = sys.modules.get(TRACE_API_MODULE)
    if api is None:
        return _NO_SPAN
    current: Span = api.get_current_span()
    if not current.is_recording():
        return _NO_SPAN
    return _child(_tracer(api), name, attributes)


_tracers: dict[str, Tracer] = {}


def _tracer(api: ModuleType) -> Tracer:
    """Our tracer of the global provider, made once: making one costs a third of a span.

    Kept even when made before a provider was set: the API's proxy tracer then
    follows the provider set later (one can be set once per process).
    """
    tracer = _tracers.get(TRACER_NAME)
    if tracer is None:
        tracer = _tracers[TRACER_NAME] = api.get_tracer(TRACER_NAME)
    return tracer


@contextlib.contextmanager
def _child(tracer: Tracer, name: str, attributes: Mapping[str, str] | None) -> Iterator[Span]:
    with tracer.start_as_current_span(
        name,
        attributes=dict(attributes) if attributes else None,
        # Exception texts may quote what a peer sent: the span keeps the type only.
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except BaseException as exc:
            mark_failed(span, exc)
            raise


def mark_failed(span: Span, exc: BaseException) -> None:
    """Status ERROR on `span`, described by the exception's type alone (never its text)."""
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
