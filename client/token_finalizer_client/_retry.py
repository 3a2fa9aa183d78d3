"""When to repeat an HTTP call, and how long to wait first.

The one retry policy of the package, shared by the sync and async clients and
the writer-side sink: repeat on connection trouble and on 502/503/504 (the
server or a proxy in front of it is momentarily unable), never on any other
status. Every call this package makes is safe to repeat: finalize freezes
idempotently, retire and the store writes are conditional or idempotent.

A caller drives one `RetryBudget` per logical call:

    budget = RetryBudget(max_retries)
    while True:
        try:
            response = send()
        except httpx.RequestError as exc:
            delay = budget.after_error(exc)
            if delay is None:
                raise connection_error(exc) from exc
        else:
            delay = budget.after_response(response)
            if delay is None:
                return response
        sleep(delay)
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Collection

import httpx

from token_finalizer_client._constants import (
    RETRY_BASE_DELAY_S,
    RETRY_MAX_DELAY_S,
    RETRY_STATUSES,
)
from token_finalizer_client._exceptions import APIConnectionError, APITimeoutError

__all__ = [
    "RetryBudget",
    "backoff_delay",
    "connection_error",
    "is_retryable_error",
    "is_retryable_status",
]

# Transient by nature. Others (an unsupported URL scheme, a local protocol
# misuse, a body that fails to decode) would fail the same way again.
_TRANSIENT_ERRORS = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


def is_retryable_status(status_code: int) -> bool:
    """Whether an answer with this status may be repeated (502, 503, 504)."""
    return status_code in RETRY_STATUSES


def is_retryable_error(exc: BaseException) -> bool:
    """Whether a failed request (no HTTP answer) may be repeated."""
    return isinstance(exc, _TRANSIENT_ERRORS)


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
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.max_retries = max_retries
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
