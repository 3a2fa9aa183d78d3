"""The store server's /metrics, called in-process: who may read it, and how requests are labelled.

Real processes (two workers summed, every route's histogram):
tests/integration/test_store_metrics.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.asgi import in_process
from tests.support.captures import make_entry
from token_finalizer import MemoryTokenStore
from token_finalizer.store_server import create_store_app
from token_finalizer.store_server.roles import StoreTokens

TOKENS = StoreTokens(writer=("w-token",), finalizer=("f-token",), control=("c-token",))
CONTROL = {"Authorization": "Bearer c-token"}
PUT = "/ng-rollout/r1/training-token-capture/calls/c1"


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    """An in-process client of a store server over a memory store, with role tokens."""
    with in_process(create_store_app(MemoryTokenStore(), tokens=TOKENS)) as client:
        yield client


def _value(http: httpx.Client, metric: str, **labels: str) -> float:
    text = http.get("/metrics", headers=CONTROL).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == metric and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def test_metrics_needs_a_token(http: httpx.Client) -> None:
    """GET /metrics without a bearer token is a 401, like every route but /health."""
    assert http.get("/metrics").status_code == 401


def test_any_role_reads_metrics(http: httpx.Client) -> None:
    """A control token (no write, no freeze) reads /metrics: a scraper needs no other power."""
    assert http.get("/metrics", headers=CONTROL).status_code == 200


def test_a_refused_put_is_counted_with_its_route_and_role(http: httpx.Client) -> None:
    """A put with a finalizer token is counted as route put, role writer, status 403."""
    entry = make_entry("r1", "c1", [1, 2], [3])
    assert http.put(PUT, json=entry, headers={"Authorization": "Bearer f-token"}).status_code == 403
    labels = {"route": "put", "role": "writer", "status": "403"}
    assert _value(http, "token_finalizer_store_requests_total", **labels) == 1


def test_a_refused_put_stores_nothing(http: httpx.Client) -> None:
    """A put refused with 422 counts no entry stored."""
    headers = {"Authorization": "Bearer w-token", "Content-Type": "application/json"}
    assert http.put(PUT, content=b"[1, 2]", headers=headers).status_code == 422
    assert _value(http, "token_finalizer_store_entries_stored_total", route="put") == 0


def test_ids_never_become_labels(http: httpx.Client) -> None:
    """Paths no route serves share route "other", whatever the path holds."""
    http.get("/no/such/path/r-secret", headers=CONTROL)
    text = http.get("/metrics", headers=CONTROL).text
    assert "r-secret" not in text
    assert _value(http, "token_finalizer_store_requests_total", route="other") == 1
