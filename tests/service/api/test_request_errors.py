"""Refusals of the request itself: 400, 413, unknown paths; every body is {"error": ...}.

Most are called in-process. A Content-Length refused before any body byte, and
chunked bodies (which an in-process client hands over whole), are sent to a
real uvicorn server (`small_limit_url`) so the body really arrives in pieces.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from tests.service.api.conftest import SettingsFactory
from tests.support.asgi import in_process
from tests.support.captures import record_for
from tests.support.servers import running_app
from token_finalizer.api import create_app
from token_finalizer.settings import Settings

LIMIT = 4096
JSON = {"Content-Type": "application/json"}


@pytest.fixture
def small_limit_settings(make_settings: SettingsFactory) -> Settings:
    """Settings whose body limit is LIMIT bytes."""
    return make_settings(limits={"max_body_bytes": LIMIT})


@pytest.fixture
def small_limit_client(small_limit_settings: Settings) -> Iterator[httpx.Client]:
    """An in-process client of a service whose body limit is LIMIT bytes."""
    with in_process(create_app(small_limit_settings)) as client:
        yield client


@pytest.fixture
def small_limit_url(small_limit_settings: Settings) -> Iterator[str]:
    """A service whose body limit is LIMIT bytes, served by uvicorn on loopback."""
    with running_app(create_app(small_limit_settings)) as base:
        yield base


def _raw_exchange(base: str, request: bytes) -> bytes:
    """Send raw bytes on a fresh connection and read until the server closes or answers."""
    address = urlsplit(base)
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        sock.sendall(request)
        return sock.recv(65536)


@pytest.mark.parametrize("path", ["/finalize", "/retire"])
def test_invalid_json_is_400(client: httpx.Client, path: str) -> None:
    """A body that is not JSON answers 400 saying so."""
    response = client.post(path, content=b'{"reward": ', headers=JSON)
    assert response.status_code == 400
    assert response.json()["error"].startswith("request body is not valid JSON: ")


@pytest.mark.parametrize("path", ["/finalize", "/retire"])
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_body_not_sent_as_json_is_400(
    client: httpx.Client, path: str, content_type: str | None
) -> None:
    """A body sent without Content-Type application/json answers 400 naming the content type."""
    headers = {} if content_type is None else {"Content-Type": content_type}
    response = client.post(path, content=orjson.dumps(record_for("r-1")), headers=headers)
    assert response.status_code == 400
    assert response.json()["error"].startswith(
        "request body must be sent as Content-Type: application/json"
    )


def test_json_media_type_with_parameters_is_accepted(client: httpx.Client) -> None:
    """`application/json; charset=utf-8` is JSON: the record is finalized."""
    headers = {"Content-Type": "application/json; charset=utf-8"}
    response = client.post("/finalize", content=orjson.dumps(record_for("r-1")), headers=headers)
    assert response.status_code == 200


@pytest.mark.parametrize(
    ("body", "kind"),
    [(b"[1, 2]", "array"), (b'"text"', "string"), (b"null", "null"), (b"7", "number")],
)
def test_body_that_is_not_an_object_is_400(client: httpx.Client, body: bytes, kind: str) -> None:
    """A JSON body that is not an object answers 400 naming what it is."""
    response = client.post("/finalize", content=body, headers=JSON)
    assert (response.status_code, response.json()) == (
        400,
        {"error": f"request body must be a JSON object, got a JSON {kind}"},
    )


def test_empty_body_is_400(client: httpx.Client) -> None:
    """An empty body answers 400 asking for a JSON object."""
    response = client.post("/finalize", content=b"", headers=JSON)
    assert (response.status_code, response.json()) == (
        400,
        {"error": "request body is empty; expected a JSON object"},
    )


def test_oversized_content_length_is_refused_before_the_body(small_limit_url: str) -> None:
    """A Content-Length over the limit answers 413 although no body byte was ever sent."""
    head = (
        b"POST /finalize HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000000000\r\n\r\n"
    )
    answer = _raw_exchange(small_limit_url, head)
    assert answer.startswith(b"HTTP/1.1 413 ")


def test_oversized_body_is_413_naming_the_limit(small_limit_client: httpx.Client) -> None:
    """A body over the limit answers 413 naming limits.max_body_bytes."""
    record = record_for("r-1", padding="x" * (2 * LIMIT))
    response = small_limit_client.post("/finalize", json=record)
    assert (response.status_code, response.json()) == (
        413,
        {"error": f"request body is larger than limits.max_body_bytes ({LIMIT} bytes)"},
    )


def test_chunked_body_growing_past_the_limit_is_413(small_limit_url: str) -> None:
    """A chunked body (no Content-Length) is cut off with 413 once it passes the limit."""

    def chunks() -> Iterator[bytes]:
        yield b'{"padding": "'
        for _ in range(4):
            yield b"x" * 1024
        yield b'"}'

    response = httpx.post(small_limit_url + "/finalize", content=chunks(), headers=JSON)
    assert (response.request.headers.get("transfer-encoding"), response.status_code) == (
        "chunked",
        413,
    )


def test_chunked_body_within_the_limit_is_accepted(small_limit_url: str) -> None:
    """A chunked body under the limit is read whole and finalized."""

    def chunks() -> Iterator[bytes]:
        yield b'{"_ng_rollout_id": '
        yield b'"r-1"}'

    response = httpx.post(small_limit_url + "/finalize", content=chunks(), headers=JSON)
    assert (response.status_code, response.json()["rollout_id"]) == (200, "r-1")


def test_body_at_exactly_the_limit_is_accepted(small_limit_client: httpx.Client) -> None:
    """A body of exactly max_body_bytes is accepted."""
    prefix, suffix = b'{"padding": "', b'"}'
    body = prefix + b"x" * (LIMIT - len(prefix) - len(suffix)) + suffix
    response = small_limit_client.post("/finalize", content=body, headers=JSON)
    assert (len(body), response.status_code) == (LIMIT, 200)


def test_unknown_path_is_404_in_the_error_shape(client: httpx.Client) -> None:
    """An unknown path answers 404 with {"error": ...} naming it."""
    response = client.get("/nowhere")
    assert (response.status_code, response.json()) == (
        404,
        {"error": "no such endpoint: GET /nowhere"},
    )


def test_wrong_method_is_405_in_the_error_shape(client: httpx.Client) -> None:
    """GET /finalize answers 405 with {"error": ...}."""
    response = client.get("/finalize")
    assert (response.status_code, response.json()) == (
        405,
        {"error": "method GET is not allowed on /finalize"},
    )
