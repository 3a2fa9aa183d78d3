"""Retry logging: one warning with fields per retry of the policy, never stamina's bare line."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
import respx
import stamina

from tests.client.conftest import Connect
from token_finalizer_client import LOG_FIELDS_ATTRIBUTE, LOGGER_NAME

BASE = "http://finalizer.test"


@pytest.fixture
def mock() -> Any:
    """respx routes for a fake service at BASE."""
    with respx.mock(base_url=BASE, assert_all_called=False) as router:
        yield router


def retry_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == LOGGER_NAME]


def test_a_retried_call_logs_one_warning_with_its_fields(
    connect: Connect, mock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A 503 then a 200 leaves one warning naming the method, path, attempt, wait and error."""
    mock.get("/health").mock(
        side_effect=[httpx.Response(503), httpx.Response(200, json={"status": "ok"})]
    )
    with caplog.at_level(logging.DEBUG):
        connect(BASE, max_retries=2).health()
    (record,) = retry_records(caplog)
    assert record.levelno == logging.WARNING
    assert getattr(record, LOG_FIELDS_ATTRIBUTE) == {
        "event": "retry",
        "method": "GET",
        "path": "/health",
        "attempt": 1,
        "attempts": 3,
        "wait_s": 0.0,  # stamina's test mode: no waits in the suite
        "error": "HTTP 503",
    }
    assert record.getMessage() == (
        "GET /health failed (attempt 1 of 3: HTTP 503); retrying in 0.00s"
    )


def test_stamina_logs_nothing_of_the_policy(
    connect: Connect, mock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """No `stamina.retry_scheduled` record (the bare stderr line) for the policy's retries."""
    mock.get("/health").mock(side_effect=[httpx.Response(502), httpx.Response(200, json={})])
    with caplog.at_level(logging.DEBUG):
        connect(BASE).health()
    assert [record.name for record in caplog.records if record.name.startswith("stamina")] == []


def test_a_connection_error_is_described(
    connect: Connect, mock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A retried transport error names its kind and message, never the bearer token."""
    mock.get("/health").mock(
        side_effect=[httpx.ConnectError("refused"), httpx.Response(200, json={})]
    )
    with caplog.at_level(logging.WARNING):
        connect(BASE, token="s3cret").health()
    (record,) = retry_records(caplog)
    assert getattr(record, LOG_FIELDS_ATTRIBUTE)["error"] == "ConnectError: refused"
    assert "s3cret" not in record.getMessage() + str(getattr(record, LOG_FIELDS_ATTRIBUTE))


def test_other_stamina_retries_keep_stamina_logging(caplog: pytest.LogCaptureFixture) -> None:
    """A retry outside the policy (the application's own stamina use) is logged by stamina."""
    tries = iter([ValueError("first"), None])
    with caplog.at_level(logging.DEBUG):
        for attempt in stamina.retry_context(on=ValueError, attempts=2):
            with attempt:
                failure = next(tries)
                if failure is not None:
                    raise failure
    names = [record.name for record in caplog.records]
    assert "stamina" in names and LOGGER_NAME not in names


def test_the_package_adds_no_handler(
    connect: Connect, mock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The application decides where warnings go: the package's logger has no handler."""
    # Start from a bare logger: a server test in the same process may have configured it.
    monkeypatch.setattr(logging.getLogger(LOGGER_NAME), "handlers", [])
    mock.get("/health").mock(side_effect=[httpx.Response(503), httpx.Response(200, json={})])
    connect(BASE).health()
    assert logging.getLogger(LOGGER_NAME).handlers == []
