"""Tracing set-up: on only when OTEL_* asks for it, and then only with the SDK installed.

Each start-up is a fresh interpreter (a tracer provider is set once per
process): it builds both apps, serves a request with each, and reports
whether the SDK's tracer provider was set up and whether the apps have a span layer.
(Whether the SDK's modules are imported at all is not ours to say: redis-py 8 imports
them itself when they are installed.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from token_finalizer.tracing import tracing_requested

_PROBE = """
import json, sys, tempfile
{before}
from opentelemetry import trace
from starlette.testclient import TestClient
from token_finalizer import FileTokenStore
from token_finalizer.api import create_app
from token_finalizer.settings import settings_from_mapping
from token_finalizer.store_server import create_store_app
from token_finalizer.web.tracing import ServerSpans

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
root = tempfile.mkdtemp()
store = create_store_app(FileTokenStore(root + "/store"))
settings = settings_from_mapping({{"sources": {{"l": {{"kind": "file", "dir": root}}}}}}, env={{}})
service = create_app(settings)
for app in (store, service):
    with TestClient(app) as client:
        client.get("/health", headers={{"traceparent": TRACEPARENT}})
print("PROBE", json.dumps({{
    "sdk": type(trace.get_tracer_provider()).__module__.startswith("opentelemetry.sdk"),
    "layers": [any(m.cls is ServerSpans for m in app.user_middleware) for app in (store, service)],
}}))
"""


def _started(env: dict[str, str], before: str = "") -> tuple[dict[str, object], str]:
    clean = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    result = subprocess.run(
        [sys.executable, "-c", _PROBE.format(before=before)],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("PROBE ")]
    return json.loads(line.removeprefix("PROBE ")), result.stderr


@pytest.mark.parametrize(
    ("env", "requested"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console,otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_tracing_is_requested_only_by_an_exporter_or_an_endpoint(
    env: dict[str, str], requested: bool
) -> None:
    """An exporter other than none, or an OTLP endpoint, asks for traces; OTEL_SDK_DISABLED wins."""
    assert tracing_requested(env) is requested


def test_without_otel_variables_no_sdk_is_loaded_and_no_span_layer_added() -> None:
    """No OTEL_*: both apps serve without a span layer and no SDK tracer provider is set."""
    started, _ = _started({})
    assert started == {"sdk": False, "layers": [False, False]}


def test_with_an_exporter_named_both_apps_get_their_span_layer() -> None:
    """OTEL_TRACES_EXPORTER=console: the SDK is set up and both apps trace."""
    started, _ = _started({"OTEL_TRACES_EXPORTER": "console"})
    assert started == {"sdk": True, "layers": [True, True]}


def test_without_the_sdk_a_request_for_traces_is_logged_and_ignored() -> None:
    """OTEL_* set but no SDK installed: one warning naming the extra, and no span layer."""
    started, stderr = _started(
        {"OTEL_TRACES_EXPORTER": "otlp"}, before="sys.modules['opentelemetry.sdk'] = None"
    )
    assert started == {"sdk": False, "layers": [False, False]}
    assert "token-finalizer[otel]" in stderr
