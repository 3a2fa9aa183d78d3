"""Each error class, raised by both clients from a real answer (or a real lack of one)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from tests.client.conftest import Connect, settings_for, write_rollout
from tests.support.captures import record_for
from tests.support.servers import free_port, running_app
from tests.support.stores import stored_state
from token_finalizer import FileTokenStore
from token_finalizer.api import create_app
from token_finalizer_client import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    MaskFractionExceeded,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    ServerError,
    SourceUnavailableError,
    StoreFullError,
)
from token_finalizer_client._exceptions import error_for_status

TOKEN = "client-test-token"


@pytest.fixture(scope="module")
def strict_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A service with a bearer token, a 2 kB body limit, and a guard that trips at once."""
    root = tmp_path_factory.mktemp("strict")
    (root / "a").mkdir()
    (root / "b").mkdir()
    settings = settings_for(
        root / "a",
        root / "b",
        auth={"bearer_tokens": [TOKEN]},
        limits={"max_body_bytes": 2048},
        token_id_capture={"max_mask_fraction": 0.0, "mask_fraction_min_samples": 1},
    )
    with running_app(create_app(settings)) as base:
        yield base


async def _failing_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An ASGI app: /health is fine, /slow never answers in time, the rest fail with 500."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow/health":
        await asyncio.sleep(0.6)
    status, body = (200, b'{"status":"ok"}') if scope["path"] == "/health" else (500, b"")
    if status == 500:
        body = b'{"error":"internal error: RuntimeError"}'
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def failing_url() -> Iterator[str]:
    """A real HTTP server whose every API call answers 500."""
    with running_app(_failing_app) as base:
        yield base


def test_body_that_is_not_an_object_is_bad_request(api: Any) -> None:
    """A record that is not a JSON object raises BadRequestError (400) with the server's text."""
    with pytest.raises(BadRequestError) as caught:
        api.finalize([1, 2, 3])
    assert caught.value.status_code == 400
    assert caught.value.message == "request body must be a JSON object, got a JSON array"


def test_retire_without_a_ticket_is_bad_request(api: Any, local_store: FileTokenStore) -> None:
    """A retire object missing its `ticket` raises BadRequestError with the 422 status."""
    retire = api.finalize(record_for(write_rollout(local_store))).retire
    with pytest.raises(BadRequestError) as caught:
        api.retire({key: value for key, value in retire.items() if key != "ticket"})
    assert caught.value.status_code == 422


def test_forged_ticket_is_permission_denied(api: Any, local_store: FileTokenStore) -> None:
    """A ticket the service did not sign raises PermissionDeniedError (403); nothing retired."""
    rollout_id = write_rollout(local_store)
    retire = api.finalize(record_for(rollout_id)).retire
    with pytest.raises(PermissionDeniedError) as caught:
        api.retire({**retire, "ticket": "0" * 64})
    assert caught.value.status_code == 403
    assert stored_state(local_store, rollout_id).retired is False


def test_edited_retire_object_is_permission_denied(api: Any, local_store: FileTokenStore) -> None:
    """Changing a signed field (here the version) makes the ticket fail: PermissionDeniedError."""
    retire = api.finalize(record_for(write_rollout(local_store))).retire
    with pytest.raises(PermissionDeniedError):
        api.retire({**retire, "version": retire["version"] + 1})


def test_unknown_source_is_not_found(api: Any) -> None:
    """An unknown source name raises NotFoundError whose message lists the configured ones."""
    with pytest.raises(NotFoundError, match="configured sources: local, other"):
        api.finalize(record_for("r-1"), source="nowhere")


def test_missing_token_is_an_authentication_error(connect: Connect, strict_url: str) -> None:
    """Without a token a secured service raises AuthenticationError (401)."""
    with pytest.raises(AuthenticationError) as caught:
        connect(strict_url).finalize(record_for("r-1"))
    assert caught.value.status_code == 401


def test_wrong_token_is_an_authentication_error(connect: Connect, strict_url: str) -> None:
    """A token the service does not know raises AuthenticationError."""
    with pytest.raises(AuthenticationError, match="wrong bearer token"):
        connect(strict_url, token="not-the-token").finalize(record_for("r-1"))


def test_oversized_record_is_payload_too_large(connect: Connect, strict_url: str) -> None:
    """A record over limits.max_body_bytes raises PayloadTooLargeError (413)."""
    record = record_for("r-1", padding="x" * 4096)
    with pytest.raises(PayloadTooLargeError) as caught:
        connect(strict_url, token=TOKEN).finalize(record)
    assert caught.value.status_code == 413


def test_guard_refusal_is_mask_fraction_exceeded(connect: Connect, strict_url: str) -> None:
    """The tripped guard raises MaskFractionExceeded carrying finalized, masked and reasons."""
    client = connect(strict_url, token=TOKEN, run_id=f"run-{id(connect)}")
    with pytest.raises(MaskFractionExceeded) as caught:
        client.finalize(record_for("never-captured"))
    error = caught.value
    assert (error.status_code, error.finalized, error.masked) == (409, 1, 1)
    assert error.reasons == {"empty_capture": 1}


def test_server_failure_is_a_server_error(connect: Connect, failing_url: str) -> None:
    """A 500 answer raises ServerError with the body's error text."""
    with pytest.raises(ServerError) as caught:
        connect(failing_url).finalize(record_for("r-1"))
    assert (caught.value.status_code, caught.value.message) == (
        500,
        "internal error: RuntimeError",
    )


def test_status_errors_share_one_base(connect: Connect, failing_url: str) -> None:
    """Every error answer is an APIStatusError keeping the parsed body."""
    with pytest.raises(APIStatusError) as caught:
        connect(failing_url).retire({"rollout_id": "r-1", "ticket": "t"})
    assert caught.value.body == {"error": "internal error: RuntimeError"}


def test_nobody_listening_is_a_connection_error(connect: Connect) -> None:
    """A refused connection raises APIConnectionError once the retries are spent."""
    client = connect(f"http://127.0.0.1:{free_port()}", max_retries=1)
    with pytest.raises(APIConnectionError, match="no answer from the server"):
        client.health()


def test_slow_answer_is_a_timeout_error(connect: Connect, failing_url: str) -> None:
    """An answer slower than the timeout raises APITimeoutError."""
    client = connect(failing_url + "/slow", timeout=0.1, max_retries=0)
    with pytest.raises(APITimeoutError):
        client.health()


def test_unknown_path_is_not_found(connect: Connect, service_url: str) -> None:
    """A base URL with a wrong prefix raises NotFoundError with the service's message."""
    with pytest.raises(NotFoundError, match="no such endpoint: GET /wrong-prefix/health"):
        connect(f"{service_url}/wrong-prefix").health()


def test_store_outage_503_is_source_unavailable() -> None:
    """A 503 naming a source maps to SourceUnavailableError, which says which source."""
    error = error_for_status(
        503, {"error": "source 'remote' could not be reached", "source": "remote"}
    )
    assert isinstance(error, SourceUnavailableError) and isinstance(error, ServerError)
    assert error.source == "remote"


def test_other_503_stays_a_server_error() -> None:
    """A 503 without a source (a proxy, a draining server) is a plain ServerError."""
    error = error_for_status(503, "Service Unavailable")
    assert type(error) is ServerError


def test_507_is_store_full_with_the_stores_memory() -> None:
    """A 507 is StoreFullError (a ServerError) carrying the body's `memory`."""
    memory = {"used": 95, "max": 100, "fraction": 0.95, "high_water": 0.9}
    error = error_for_status(507, {"error": "memory is above the mark", "memory": memory})
    assert isinstance(error, StoreFullError) and isinstance(error, ServerError)
    assert (error.memory, error.message) == (memory, "memory is above the mark")


def test_507_without_memory_has_an_empty_memory() -> None:
    """A 507 of a store that names no memory (a full disk) has `memory == {}`."""
    error = error_for_status(507, {"error": "no space left"})
    assert isinstance(error, StoreFullError) and error.memory == {}
