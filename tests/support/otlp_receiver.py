"""An OTLP/HTTP trace receiver on loopback: what the servers' exporters send, decoded.

`otlp_receiver()` serves `POST /v1/traces` (protobuf, gzip or not) on a free
port in a thread and yields an `OtlpReceiver`, whose `spans()` are every span
received so far, flattened with their resource's `service.name`. Decoded
with opentelemetry-proto, which comes with the OTLP exporter.
"""

from __future__ import annotations

import contextlib
import gzip
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

__all__ = ["OtlpReceiver", "ReceivedSpan", "otlp_receiver"]


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span: ids in hex, as W3C headers write them."""

    service: str
    scope: str  # the instrumentation scope: the name of the tracer that made it
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]


def _value(any_value: Any) -> Any:
    which = any_value.WhichOneof("value")
    if which == "array_value":
        return [_value(item) for item in any_value.array_value.values]
    return getattr(any_value, which) if which else None


def _decoded(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest.FromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        service=str(resource.get("service.name")),
                        scope=scope_spans.scope.name,
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        kind=span.kind,
                        attributes={kv.key: _value(kv.value) for kv in span.attributes},
                    )
                )
    return spans


@dataclass
class OtlpReceiver:
    """The receiver's URL (the exporters' OTEL_EXPORTER_OTLP_ENDPOINT) and what it got."""

    endpoint: str
    _spans: list[ReceivedSpan] = field(default_factory=list)
    # Every path an exporter posted to (metrics and logs too, which are not decoded).
    paths: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, spans: list[ReceivedSpan]) -> None:
        with self._lock:
            self._spans.extend(spans)

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def wait_for(
        self, enough: Callable[[list[ReceivedSpan]], bool], *, timeout: float = 30.0
    ) -> list[ReceivedSpan]:
        """Every span received once `enough(spans)` holds (what there is after `timeout`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            spans = self.spans()
            if enough(spans):
                return spans
            time.sleep(0.05)
        return self.spans()


@contextlib.contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """Serve OTLP/HTTP traces on 127.0.0.1 until the block ends."""
    received: list[OtlpReceiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            ok = self.path == "/v1/traces"
            received[0].paths.add(self.path)
            if ok:
                received[0].add(_decoded(body))
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the test reads spans, not access lines."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    received.append(OtlpReceiver(f"http://127.0.0.1:{server.server_address[1]}"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield received[0]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
