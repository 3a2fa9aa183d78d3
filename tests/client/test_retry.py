"""The retry policy: which failures are repeated, how often, and how long between tries.

Unit tests of the httpx side with respx (the live tests cover the answers).
Backoff waits are off for the whole suite (stamina's test mode, see
tests/conftest.py); the tests of the waits themselves turn it off and record
the sleeps instead of sleeping.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
import respx
import stamina

from tests.client.answers import RETIRE
from tests.client.conftest import Connect
from tests.support.captures import record_for
from token_finalizer_client import APIConnectionError, BadRequestError, ServerError
from token_finalizer_client._constants import RETRY_BASE_DELAY_S, RETRY_MAX_DELAY_S
from token_finalizer_client._retry import RetryPolicy

BASE = "http://finalizer.test"
ANSWER = {
    "rollout_id": "r-1",
    "source": "local",
    "record": record_for("r-1"),
    "build": None,
    "retirable": False,
    "retire": None,
}


def waits_of(
    policy: RetryPolicy, answer: httpx.Response, monkeypatch: pytest.MonkeyPatch
) -> list[float]:
    """The waits between the tries of a blocking call answered `answer` every time."""
    waits: list[float] = []
    monkeypatch.setattr(time, "sleep", waits.append)
    with stamina.set_testing(False):
        final = policy.call(lambda: answer)
    assert final is answer
    return waits


@pytest.fixture
def mock() -> Any:
    """respx routes for the fake service at BASE."""
    with respx.mock(base_url=BASE, assert_all_called=False) as router:
        yield router


@pytest.mark.parametrize("status", [502, 503, 504])
def test_unavailable_then_ok_succeeds(connect: Connect, mock: Any, status: int) -> None:
    """A 502/503/504 followed by a 200 returns the 200's result after two calls."""
    route = mock.post("/finalize").mock(
        side_effect=[httpx.Response(status), httpx.Response(200, json=ANSWER)]
    )
    assert connect(BASE).finalize(record_for("r-1")).rollout_id == "r-1"
    assert route.call_count == 2


def test_bad_request_is_not_retried(connect: Connect, mock: Any) -> None:
    """A 400 raises at once: exactly one call."""
    route = mock.post("/finalize").mock(return_value=httpx.Response(400, json={"error": "no"}))
    with pytest.raises(BadRequestError):
        connect(BASE).finalize(record_for("r-1"))
    assert route.call_count == 1


def test_internal_error_is_not_retried(connect: Connect, mock: Any) -> None:
    """A 500 is not in the retry set: one call, ServerError."""
    route = mock.post("/finalize").mock(return_value=httpx.Response(500, json={"error": "bug"}))
    with pytest.raises(ServerError):
        connect(BASE).finalize(record_for("r-1"))
    assert route.call_count == 1


@pytest.mark.parametrize(
    "failure", [httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), httpx.ReadError("reset")]
)
def test_connection_failure_then_ok_succeeds(
    connect: Connect, mock: Any, failure: Exception
) -> None:
    """A connect error, timeout or broken read is repeated, and the retry's answer returned."""
    route = mock.post("/finalize").mock(side_effect=[failure, httpx.Response(200, json=ANSWER)])
    assert connect(BASE).finalize(record_for("r-1")).rollout_id == "r-1"
    assert route.call_count == 2


def test_non_transient_request_error_is_not_retried(connect: Connect, mock: Any) -> None:
    """A local protocol misuse would fail again: one call, APIConnectionError."""
    route = mock.post("/finalize").mock(side_effect=httpx.LocalProtocolError("bad header"))
    with pytest.raises(APIConnectionError):
        connect(BASE).finalize(record_for("r-1"))
    assert route.call_count == 1


def test_retries_stop_after_max_retries(connect: Connect, mock: Any) -> None:
    """An endless 503 is tried 1 + max_retries times, then raises ServerError."""
    route = mock.post("/finalize").mock(return_value=httpx.Response(503, json={"error": "busy"}))
    with pytest.raises(ServerError, match="busy"):
        connect(BASE, max_retries=3).finalize(record_for("r-1"))
    assert route.call_count == 4


def test_zero_retries_means_one_try(connect: Connect, mock: Any) -> None:
    """max_retries=0 sends each request once."""
    route = mock.get("/health").mock(side_effect=httpx.ConnectError("refused"))
    with pytest.raises(APIConnectionError):
        connect(BASE, max_retries=0).health()
    assert route.call_count == 1


def test_retire_is_retried_too(connect: Connect, mock: Any) -> None:
    """retire is safe to repeat: a 503 is retried like finalize."""
    route = mock.post("/retire").mock(
        side_effect=[httpx.Response(503), httpx.Response(200, json={"retired": True})]
    )
    assert connect(BASE).retire(RETIRE) is True
    assert route.call_count == 2


def test_not_ready_is_reported_not_retried(connect: Connect, mock: Any) -> None:
    """/ready's 503 is its answer: one call, readiness False."""
    route = mock.get("/ready").mock(
        return_value=httpx.Response(503, json={"status": "unavailable", "sources": {}})
    )
    assert connect(BASE).ready().ready is False
    assert route.call_count == 1


@pytest.mark.parametrize("attempt", range(8))
def test_backoff_stays_within_its_exponential_bound(
    attempt: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retry n waits base * 2**n plus up to one base of jitter, never over the cap."""
    waits = waits_of(RetryPolicy(max_retries=8), httpx.Response(503), monkeypatch)
    floor = min(RETRY_MAX_DELAY_S, RETRY_BASE_DELAY_S * 2**attempt)
    ceiling = min(RETRY_MAX_DELAY_S, RETRY_BASE_DELAY_S * (2**attempt + 1))
    assert floor <= waits[attempt] <= ceiling


def test_backoff_is_jittered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waits of the same retry differ, so failed clients do not retry in lockstep."""
    policy = RetryPolicy(max_retries=1)
    firsts = {waits_of(policy, httpx.Response(503), monkeypatch)[0] for _ in range(20)}
    assert len(firsts) > 1


def test_retry_after_sets_the_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 503 with Retry-After waits that long before each retry (within the cap)."""
    answer = httpx.Response(503, headers={"Retry-After": "1.5"})
    waits = waits_of(RetryPolicy(max_retries=2), answer, monkeypatch)
    assert waits == [1.5, 1.5]


def test_retry_after_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A huge Retry-After does not stall the client beyond the maximum delay."""
    answer = httpx.Response(503, headers={"Retry-After": "3600"})
    waits = waits_of(RetryPolicy(max_retries=2), answer, monkeypatch)
    assert waits == [RETRY_MAX_DELAY_S, RETRY_MAX_DELAY_S]


def test_negative_max_retries_is_refused() -> None:
    """A retry budget below zero is a ValueError naming max_retries."""
    with pytest.raises(ValueError, match="max_retries"):
        RetryPolicy(max_retries=-1)
