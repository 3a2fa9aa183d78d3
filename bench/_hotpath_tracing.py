"""The hot-path bench with tracing on (`--tracing sdk`): what a traced model server pays per call.

With tracing `sdk`, a served side runs as a NeMo Gym model server with
OpenTelemetry would drive it, against a store server with the SDK on:

- the caller: every model call's capture work (resolve, begin_call, put) runs
  within a span of the caller's own (`caller_scope`), so the client injects its
  `traceparent` into each request. That span comes from an SDK tracer provider
  of the bench's that exports nothing: the model server's own spans and their
  export are its cost, not ours, and the span is opened and closed outside the
  timed work (`_hotpath_driver.CallScope`);
- the store server: `OTEL_TRACES_EXPORTER=otlp` (`tracing_env`), so it records
  a server span per request and a span per Redis script call and exports them
  in batches (the SDK's BatchSpanProcessor, OTLP/HTTP protobuf) to a receiver
  on loopback that runs in a process of its own (`otlp_receiver_process`) and
  counts what it got, as a collector on the same host would.

Tracing `off` is the plain run: no `OTEL_*`, no current span. docs/tracing.md#cost.
Run as a module, this is that receiver's process: it prints its endpoint, serves
until its standard input closes, then prints how many spans it received.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from bench._hotpath_driver import CallScope

__all__ = ["TRACING_MODES", "SpanCount", "caller_scope", "otlp_receiver_process", "tracing_env"]

TRACING_MODES = ("off", "sdk")
# Short enough that the spans of a run are exported during it, not all at its end.
_BATCH_DELAY_MS = "200"
_RECEIVER_STOP_S = 30.0


def caller_scope() -> CallScope:
    """A model server's request span around each call: recorded, sampled, exported nowhere."""
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("hotpath-model-server")

    def scope() -> contextlib.AbstractContextManager[object]:
        return tracer.start_as_current_span("model call")

    return scope


def tracing_env(endpoint: str) -> dict[str, str]:
    """The store server's `OTEL_*`: the SDK on, exporting OTLP/HTTP to `endpoint`."""
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": _BATCH_DELAY_MS,
    }


@dataclass
class SpanCount:
    """The receiver's endpoint; once its block has ended, the spans it received."""

    endpoint: str
    spans: int | None = None


@contextlib.contextmanager
def otlp_receiver_process() -> Iterator[SpanCount]:
    """An OTLP/HTTP trace receiver in a child process until the block ends."""
    receiver = subprocess.Popen(
        [sys.executable, "-m", "bench._hotpath_tracing"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert receiver.stdin is not None
    assert receiver.stdout is not None
    try:
        count = SpanCount(receiver.stdout.readline().strip())
        if not count.endpoint.startswith("http://"):
            raise RuntimeError(f"the OTLP receiver did not start: {count.endpoint!r}")
        yield count
        receiver.stdin.close()
        count.spans = int(receiver.stdout.readline().strip() or "-1")
        receiver.wait(timeout=_RECEIVER_STOP_S)
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()


def _serve() -> None:
    from tests.support.otlp_receiver import otlp_receiver

    with otlp_receiver() as receiver:
        print(receiver.endpoint, flush=True)
        sys.stdin.read()
        print(len(receiver.spans()), flush=True)


if __name__ == "__main__":
    _serve()
