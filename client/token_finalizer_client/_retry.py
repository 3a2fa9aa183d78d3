"""When to repeat an HTTP call, how long to wait first, and the loop that does it.

The one retry policy of the package, shared by the sync and async clients and
the writer-side sink: repeat on connection trouble and on 502/503/504 (the
server or a proxy in front of it is momentarily unable), never on any other
status. Every call this package makes is safe to repeat: finalize freezes
idempotently, retire and the store writes are conditional or idempotent.

`RetryBudget` holds the decisions of one logical call. `send_with_retries`
(blocking) and `asend_with_retries` (asyncio) are the loop around it: they
differ only in how they send and how they sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Collection
from typing import TypeAlias

import httpx

from token_finalizer_client._constants import (
    RETRY_BASE_DELAY_S,
    RETRY_MAX_DELAY_S,
    RETRY_STATUSES,
)
from token_finalizer_client._exceptions import APIConnectionError, APITimeoutError
from token_finalizer_client._wire import WireRequest

__all__ = [
    "Outcome",
    "RetryBudget",
    "asend_with_retries",
    "backoff_delay",
    "check_max_retries",
    "connection_error",
    "final_answer",
    "is_retryable_error",
    "is_retryable_status",
    "send_with_retries",
]

# What one try of a request ends with: an HTTP answer, or none.
Outcome: TypeAlias = httpx.Response | httpx.RequestError

# Transient by nature. Others (an unsupported URL scheme, a local protocol
# misuse, a body that fails to decode) would fail the same way again.
_TRANSIENT_ERRORS = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


def is_retryable_status(status_code: int) -> bool:
    """Whether an answer with this status may be repeated (502, 503, 504)."""
    return status_code in RETRY_STATUSES


def is_retryable_error(exc: BaseException) -> bool:
    """Whether a failed request (no HTTP answer) may be repeated."""
    return isinstance(exc, _TRANSIENT_ERRORS)


def check_max_retries(max_retries: int) -> int:
    """`max_retries` itself; ValueError when it is below zero."""
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    return max_retries


def backoff_delay(
    attempt: int, *, base: float = RETRY_BASE_DELAY_S, cap: float = RETRY_MAX_DELAY_S
) -> float:
    """Seconds to wait before retry number `attempt` (0-based): exponential, full jitter.

    Full jitter spreads the retries of many clients that failed together, so a
    restarting server is not hit by all of them at the same instant.
    """
    return random.uniform(0.0, min(cap, base * (2**attempt)))


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: rare for these statuses, and the backoff covers it
    return max(0.0, seconds)


def connection_error(exc: httpx.RequestError) -> APIConnectionError:
    """The package's error for a request that got no HTTP answer."""
    url = ""
    with contextlib.suppress(RuntimeError):  # RuntimeError: no request attached
        url = f" ({exc.request.method} {exc.request.url})"
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return APITimeoutError(f"request timed out{url}: {detail}")
    return APIConnectionError(f"no answer from the server{url}: {detail}")


class RetryBudget:
    """The retries left for one logical call, and the delay before each."""

    def __init__(self, max_retries: int, *, statuses: Collection[int] = RETRY_STATUSES) -> None:
        self.max_retries = check_max_retries(max_retries)
        self.statuses = statuses
        self.attempt = 0

    def _spend(self, floor: float = 0.0) -> float | None:
        if self.attempt >= self.max_retries:
            return None
        delay = max(backoff_delay(self.attempt), min(floor, RETRY_MAX_DELAY_S))
        self.attempt += 1
        return delay

    def after_error(self, exc: BaseException) -> float | None:
        """Delay before repeating a request that got no answer; None: give up."""
        return self._spend() if is_retryable_error(exc) else None

    def after_response(self, response: httpx.Response) -> float | None:
        """Delay before repeating this answer's request; None: the answer stands."""
        if response.status_code not in self.statuses:
            return None
        return self._spend(_retry_after(response) or 0.0)

    def delay_after(self, outcome: Outcome) -> float | None:
        """Delay before repeating the try that ended in `outcome`; None: it is final."""
        if isinstance(outcome, httpx.Response):
            return self.after_response(outcome)
        return self.after_error(outcome)


def final_answer(outcome: Outcome) -> httpx.Response:
    """The answer a call ended with; the package's connection error when it got none."""
    if isinstance(outcome, httpx.RequestError):
        raise connection_error(outcome) from outcome
    return outcome


def send_with_retries(http: httpx.Client, request: WireRequest, max_retries: int) -> httpx.Response:
    """Send `request` on a blocking pool, repeated as the policy allows; the final answer.

    Any answer is returned, error statuses included (the caller reads them);
    APIConnectionError (or APITimeoutError) when the last try got none.
    """
    budget = RetryBudget(max_retries, statuses=request.retry_statuses)
    outcome = _try(http, request)
    while (delay := budget.delay_after(outcome)) is not None:
        time.sleep(delay)
        outcome = _try(http, request)
    return final_answer(outcome)


async def asend_with_retries(
    http: httpx.AsyncClient, request: WireRequest, max_retries: int
) -> httpx.Response:
    """`send_with_retries` on an asyncio pool: the same tries, the same waits."""
    budget = RetryBudget(max_retries, statuses=request.retry_statuses)
    outcome = await _atry(http, request)
    while (delay := budget.delay_after(outcome)) is not None:
        await asyncio.sleep(delay)
        outcome = await _atry(http, request)
    return final_answer(outcome)


def _try(http: httpx.Client, request: WireRequest) -> Outcome:
    try:
        return http.request(**request.send_options())
    except httpx.RequestError as exc:
        return exc


async def _atry(http: httpx.AsyncClient, request: WireRequest) -> Outcome:
    try:
        return await http.request(**request.send_options())
    except httpx.RequestError as exc:
        return exc
