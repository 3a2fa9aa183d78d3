"""GET /health, /ready, /metrics and the OpenAPI document."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI

from tests.service.api.conftest import CaptureWriter, SettingsFactory
from tests.support.asgi import in_process
from tests.support.captures import agent_rollout, record_for
from tests.support.servers import free_port
from token_finalizer import FileTokenStore, MemoryTokenStore
from token_finalizer.api import create_app


class UnreachableStore(MemoryTokenStore):
    """A store whose every remote call fails, as a dead capture store would."""

    async def ping(self) -> None:
        raise ConnectionError("capture store refused the connection")

    async def freeze(self, rollout_id: str) -> Any:
        raise ConnectionError("capture store refused the connection")


def _metric(text: str, line_start: str) -> float:
    """The value of the first exposition line starting with `line_start`."""
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric line starts with {line_start!r}")


def test_health_is_ok(client: httpx.Client) -> None:
    """GET /health answers 200 {"status": "ok"}."""
    response = client.get("/health")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


def test_ready_lists_each_reachable_source(client: httpx.Client) -> None:
    """GET /ready answers 200 with each configured source reachable."""
    response = client.get("/ready")
    assert (response.status_code, response.json()) == (
        200,
        {"status": "ready", "sources": {"local": {"reachable": True}}},
    )


def test_ready_is_503_when_a_source_is_down(make_settings: SettingsFactory) -> None:
    """One unreachable source makes /ready answer 503 naming it and the reason."""
    app = create_app(make_settings(), sources={"remote": UnreachableStore()})
    with in_process(app) as client:
        response = client.get("/ready")
    body = response.json()
    assert (response.status_code, body["error"]) == (503, "source(s) unreachable: remote")
    assert body["sources"]["remote"] == {
        "reachable": False,
        "error": "ConnectionError: capture store refused the connection",
    }


def test_ready_is_503_for_an_unreachable_http_store(make_settings: SettingsFactory) -> None:
    """A configured http source with nothing listening makes /ready answer 503."""
    settings = make_settings(
        sources={"train-a": {"kind": "http", "url": f"http://127.0.0.1:{free_port()}"}}
    )
    with in_process(create_app(settings)) as client:
        response = client.get("/ready")
    body = response.json()
    assert (response.status_code, body["sources"]["train-a"]["reachable"]) == (503, False)


def test_ready_is_503_while_draining(app: FastAPI, client: httpx.Client) -> None:
    """Once shutdown began, /ready answers 503 `draining` while /health still answers."""
    app.state.service.begin_draining()
    ready, health = client.get("/ready"), client.get("/health")
    assert (ready.status_code, ready.json()["status"], health.status_code) == (503, "draining", 200)


def test_metrics_count_finalize_outcomes_by_source(
    client: httpx.Client, write_capture: CaptureWriter
) -> None:
    """/metrics counts finalize calls by source and outcome (ok, masked)."""
    write_capture("r-1")
    client.post("/finalize", json=record_for("r-1"))
    client.post("/finalize", json=record_for("empty"))
    client.post("/finalize", json=record_for("empty-2"))
    text = client.get("/metrics").text
    assert (
        _metric(text, 'token_finalizer_finalize_total{outcome="ok",source="local"}'),
        _metric(text, 'token_finalizer_finalize_total{outcome="masked",source="local"}'),
    ) == (1.0, 2.0)


def test_metrics_count_mask_reasons(client: httpx.Client) -> None:
    """/metrics counts masked builds by their short reason."""
    client.post("/finalize", json=record_for("empty"))
    text = client.get("/metrics").text
    line = 'token_finalizer_mask_reasons_total{reason="empty_capture",source="local"}'
    assert _metric(text, line) == 1.0


def test_metrics_count_no_build(make_settings: SettingsFactory) -> None:
    """A record of an agent that does not take part is counted as outcome no_build."""
    settings = make_settings(token_id_capture={"enabled": False})
    with in_process(create_app(settings)) as client:
        client.post("/finalize", json=record_for("r-1"))
        text = client.get("/metrics").text
    line = 'token_finalizer_finalize_total{outcome="no_build",source="local"}'
    assert _metric(text, line) == 1.0


def test_metrics_count_retire_outcomes(
    client: httpx.Client, write_capture: CaptureWriter, file_store: FileTokenStore
) -> None:
    """/metrics counts retire calls by outcome (retired, stale)."""
    write_capture("r-1")
    write_capture("r-2")
    client.post("/retire", json=client.post("/finalize", json=record_for("r-1")).json())
    stale = client.post("/finalize", json=record_for("r-2")).json()
    anyio.run(file_store.mark_incomplete, "r-2", "late")
    client.post("/retire", json=stale)
    text = client.get("/metrics").text
    assert (
        _metric(text, 'token_finalizer_retire_total{outcome="retired",source="local"}'),
        _metric(text, 'token_finalizer_retire_total{outcome="stale",source="local"}'),
    ) == (1.0, 1.0)


class _DropFailingStore(MemoryTokenStore):
    """A store that freezes, but whose drop cannot reach the capture store."""

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        raise ConnectionError("capture store refused the connection")


def test_metrics_count_failed_retires(make_settings: SettingsFactory) -> None:
    """A retire whose drop raises is counted as outcome failed."""
    store = _DropFailingStore()

    async def write() -> None:
        for entry in agent_rollout("r-1", calls=2, new_tokens_per_turn=20):
            await store.put(entry)

    anyio.run(write)
    with in_process(create_app(make_settings(), sources={"flaky": store})) as client:
        answer = client.post("/finalize?source=flaky", json=record_for("r-1")).json()
        client.post("/retire", json=answer)
        text = client.get("/metrics").text
    line = 'token_finalizer_retire_total{outcome="failed",source="flaky"}'
    assert _metric(text, line) == 1.0


def test_metrics_count_source_errors(make_settings: SettingsFactory) -> None:
    """A source whose freeze raises is counted in source errors (and the record is masked)."""
    app = create_app(make_settings(), sources={"remote": UnreachableStore()})
    with in_process(app) as client:
        answer = client.post("/finalize?source=remote", json=record_for("r-1")).json()
        text = client.get("/metrics").text
    line = 'token_finalizer_source_errors_total{operation="freeze",source="remote"}'
    assert (answer["build"]["mask_sample"], _metric(text, line)) == (True, 1.0)


def test_metrics_time_finalize_requests(client: httpx.Client) -> None:
    """The latency histogram has one observation per finalize call."""
    client.post("/finalize", json=record_for("r-1"))
    text = client.get("/metrics").text
    line = 'token_finalizer_request_seconds_count{endpoint="/finalize",status="200"}'
    assert _metric(text, line) == 1.0


def test_metrics_are_prometheus_text(client: httpx.Client) -> None:
    """/metrics answers in the Prometheus text exposition format."""
    response = client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=")
    assert "# TYPE token_finalizer_finalize_total counter" in response.text


def test_two_apps_in_one_process_keep_separate_metrics(
    make_settings: SettingsFactory, client: httpx.Client
) -> None:
    """A second app's counters start at zero: each app has its own registry."""
    client.post("/finalize", json=record_for("r-1"))
    with in_process(create_app(make_settings())) as other:
        text = other.get("/metrics").text
    assert 'token_finalizer_finalize_total{outcome="masked"' not in text


@pytest.mark.parametrize("path", ["/finalize", "/retire", "/health", "/ready", "/metrics"])
def test_openapi_lists_every_endpoint(client: httpx.Client, path: str) -> None:
    """The OpenAPI document lists each endpoint."""
    assert path in client.get("/openapi.json").json()["paths"]


RETIRE_FIELDS = {"rollout_id", "source", "snapshot_id", "version", "ticket"}


def _required_sets(schema: dict[str, Any]) -> list[set[str]]:
    """The `required` key sets of a schema and of its oneOf/anyOf alternatives."""
    sets = [set(schema["required"])] if "required" in schema else []
    for key in ("oneOf", "anyOf"):
        for alternative in schema.get(key, []):
            sets += _required_sets(alternative)
    return sets


def _request_schema(client: httpx.Client, path: str) -> dict[str, Any]:
    operation = client.get("/openapi.json").json()["paths"][path]["post"]
    schema: dict[str, Any] = operation["requestBody"]["content"]["application/json"]["schema"]
    return schema


def test_openapi_documents_the_finalize_request_body(client: httpx.Client) -> None:
    """/finalize documents a JSON object request body (the record) with no required keys."""
    schema = _request_schema(client, "/finalize")
    assert (schema["type"], schema.get("required")) == ("object", None)


def test_openapi_documents_the_retire_ticket_body(client: httpx.Client) -> None:
    """/retire documents the finalize answer's `retire` object (all five fields) as its body."""
    assert RETIRE_FIELDS in _required_sets(_request_schema(client, "/retire"))


def test_openapi_documents_the_finalize_answer(client: httpx.Client) -> None:
    """The finalize 200 answer lists rollout_id, source, record, build, retirable and retire."""
    operation = client.get("/openapi.json").json()["paths"]["/finalize"]["post"]
    schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert set(schema["required"]) == {
        "rollout_id",
        "source",
        "record",
        "build",
        "retirable",
        "retire",
    }


def test_openapi_documents_the_retire_refusals(client: httpx.Client) -> None:
    """/retire documents its v2 refusals: 403 (ticket), 409 (stale), 422, 503 (store down)."""
    responses = client.get("/openapi.json").json()["paths"]["/retire"]["post"]["responses"]
    assert {"403", "409", "422", "503"} <= set(responses)


def test_docs_page_is_served(client: httpx.Client) -> None:
    """/docs serves the interactive API page."""
    response = client.get("/docs")
    assert (response.status_code, "swagger" in response.text.lower()) == (200, True)


def test_metrics_expose_process_rss_fds_and_cpu(client: httpx.Client) -> None:
    """/metrics carries the process's resident memory, open fds and CPU time."""
    text = client.get("/metrics").text
    for metric in (
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_cpu_seconds_total",
    ):
        assert any(line.startswith(metric + " ") for line in text.splitlines()), metric
