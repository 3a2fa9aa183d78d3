"""The project's one retry policy: what is retryable, how often, how long between tries.

Every HTTP call the project repeats goes through `RetryPolicy`: the sync and
async clients, the writer-side `HttpTokenSink`, and the service's `http`
capture source (`token_finalizer.sources.http`). The service imports it through
the public `token_finalizer_client.transport` rather than configuring stamina a
second time: the service distribution depends on this client package, and
this way "what is retryable" (`is_retryable_error`, `RETRY_STATUSES`) is
defined exactly once. Each caller passes only its own numbers: attempts and
delays.

What is retried: transport errors that are transient by nature (timeouts,
network errors, a connection dropped mid-answer) and 502/503/504 answers (the
server, or a proxy in front of it, is momentarily unable). Never any other
status, nor a request error that would fail the same way again (an
unsupported URL scheme, a local protocol misuse, a body that fails to
decode). Every call repeated this way is safe to repeat: finalize freezes
idempotently, retire and the store writes are conditional or idempotent.

How: stamina (over tenacity) runs the loop. The wait before retry n (1-based)
is `min(max_delay, base_delay * 2**(n-1) + uniform(0, base_delay))`:
exponential, with jitter so that clients that failed together do not retry in
lockstep. A `Retry-After` of a retryable answer replaces that wait, capped at
`max_delay`. At most `max_retries` retries. Tests turn every wait off with
`stamina.set_testing(True, ...)` (see tests/conftest.py).

How long: a call may pass `deadline_s`, after which no try starts (stamina's
own timeout) and, through `send_with_retries`, no try runs on: the package's
clients bound each try's whole exchange by their `timeout` and the call by
`call_deadline_s` (every try plus every wait; docs/architecture.md#bounded-answers).

Each retry is logged once, as a warning on the `token_finalizer_client`
logger naming the method and path (`_retry_log`), never as stamina's bare line.

A retryable answer is raised inside the attempt as `RetryableAnswer` so that
stamina sees it; when the retries run out, the last answer is returned, not
raised: callers read its status as they read any other answer.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

import httpx
import stamina

from token_finalizer_client import _retry_log
from token_finalizer_client._constants import (
    DEFAULT_MAX_RETRIES,
    RETRY_BASE_DELAY_S,
    RETRY_MAX_DELAY_S,
    RETRY_STATUSES,
)
from token_finalizer_client._exceptions import APIConnectionError, APITimeoutError
from token_finalizer_client._exchange import (
    AnswerLimits,
    AsyncPool,
    Reply,
    describe_request,
    exchange,
)
from token_finalizer_client._retry_log import RetriedCall, retrying
from token_finalizer_client._wire import WireRequest

__all__ = [
    "RETRY_STATUSES",
    "TRANSIENT_ERRORS",
    "RetryPolicy",
    "RetryableAnswer",
    "asend_with_retries",
    "call_deadline_s",
    "check_max_retries",
    "connection_error",
    "is_retryable_error",
    "retry_after",
    "send_with_retries",
]

# stamina's bare log line is replaced by the package's own, for every policy.
_retry_log.install()

# Transient by nature. Others (an unsupported URL scheme, a local protocol
# misuse, a body that fails to decode) would fail the same way again.
TRANSIENT_ERRORS: tuple[type[httpx.HTTPError], ...] = (
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.RemoteProtocolError,
)


class Answer(Protocol):
    """What the policy reads of an HTTP answer: an `httpx.Response`, or the source's own."""

    @property
    def status_code(self) -> int:
        """The HTTP status."""
        ...

    @property
    def headers(self) -> Mapping[str, str]:
        """The answer's headers (`Retry-After` is read from them)."""
        ...


_A = TypeVar("_A", bound=Answer)


class _Attempts(Protocol):
    """What `stamina.retry_context` returns: the attempts, for a loop or an async loop."""

    def __iter__(self) -> Iterator[stamina.Attempt]: ...

    def __aiter__(self) -> AsyncIterator[stamina.Attempt]: ...


def is_retryable_error(exc: BaseException) -> bool:
    """Whether a failed request (no HTTP answer) may be repeated."""
    return isinstance(exc, TRANSIENT_ERRORS)


def check_max_retries(max_retries: int) -> int:
    """`max_retries` itself; ValueError when it is below zero."""
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    return max_retries


def retry_after(headers: Mapping[str, str]) -> float | None:
    """The seconds a `Retry-After` header asks for; None when absent or an HTTP date."""
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: rare for these statuses, and the backoff covers it
    return max(0.0, seconds)


class RetryableAnswer(Exception):
    """An answer whose status asks for a retry, raised inside an attempt so stamina repeats it."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(f"HTTP {answer.status_code}")
        self.answer = answer


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently one logical call is repeated (see the module docstring)."""

    max_retries: int = DEFAULT_MAX_RETRIES
    base_delay_s: float = RETRY_BASE_DELAY_S
    max_delay_s: float = RETRY_MAX_DELAY_S

    def __post_init__(self) -> None:
        check_max_retries(self.max_retries)
        if not 0 < self.base_delay_s <= self.max_delay_s:
            raise ValueError(
                f"delays must satisfy 0 < base_delay_s <= max_delay_s, "
                f"got {self.base_delay_s} and {self.max_delay_s}"
            )

    @property
    def attempts(self) -> int:
        """Tries of one logical call at most: the first one plus the retries."""
        return self.max_retries + 1

    def backoff_hook(self, exc: Exception) -> bool | float:
        """stamina's `on` hook: False to give up, True to wait the backoff, seconds to wait."""
        if isinstance(exc, RetryableAnswer):
            asked = retry_after(exc.answer.headers)
            return min(asked, self.max_delay_s) if asked else True
        return is_retryable_error(exc)

    def _context(self, deadline_s: float | None) -> _Attempts:
        return stamina.retry_context(
            on=self.backoff_hook,
            attempts=self.attempts,
            timeout=deadline_s,
            wait_initial=self.base_delay_s,
            wait_max=self.max_delay_s,
            wait_jitter=self.base_delay_s,
        )

    def call(
        self,
        send: Callable[[], _A],
        *,
        statuses: Collection[int] = RETRY_STATUSES,
        method: str = "",
        path: str = "",
        deadline_s: float | None = None,
    ) -> _A:
        """`send()` repeated as the policy allows; the final answer, whatever its status.

        `method` and `path` name the call in the retry log lines; no try
        starts once `deadline_s` (from now) has passed. A transport error of
        the last try (or a non-retryable one) propagates.
        """
        answer: _A | None = None
        try:
            with retrying(RetriedCall(method, path, self.attempts)):
                for attempt in self._context(deadline_s):
                    with attempt:
                        answer = send()
                        if answer.status_code in statuses:
                            raise RetryableAnswer(answer)
                        return answer
        except RetryableAnswer:
            if answer is None:  # pragma: no cover - only an answer is raised as one
                raise
            return answer
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    async def acall(
        self,
        send: Callable[[], Awaitable[_A]],
        *,
        statuses: Collection[int] = RETRY_STATUSES,
        method: str = "",
        path: str = "",
        deadline_s: float | None = None,
    ) -> _A:
        """`call` for a coroutine: the same tries, the same waits, asleep on the event loop."""
        answer: _A | None = None
        try:
            with retrying(RetriedCall(method, path, self.attempts)):
                async for attempt in self._context(deadline_s):
                    with attempt:
                        answer = await send()
                        if answer.status_code in statuses:
                            raise RetryableAnswer(answer)
                        return answer
        except RetryableAnswer:
            if answer is None:  # pragma: no cover - only an answer is raised as one
                raise
            return answer
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def call_deadline_s(policy: RetryPolicy, timeout_s: float | None) -> float | None:
    """The longest a call of `policy` may take when each try takes at most `timeout_s`.

    Every try, plus the longest wait before each retry; None without a timeout.
    """
    if timeout_s is None:
        return None
    return policy.attempts * timeout_s + policy.max_retries * policy.max_delay_s


def connection_error(exc: httpx.RequestError) -> APIConnectionError:
    """The package's error for a request that got no HTTP answer."""
    where = ""
    with contextlib.suppress(RuntimeError):  # RuntimeError: no request attached
        where = f" ({describe_request(exc.request)})"
    detail = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return APITimeoutError(f"request timed out{where}: {detail}")
    return APIConnectionError(f"no answer from the server{where}: {detail}")


def send_with_retries(
    http: httpx.Client, request: WireRequest, policy: RetryPolicy, limits: AnswerLimits
) -> Reply:
    """Send `request` on a blocking pool, repeated as `policy` allows; the final answer.

    Each try's whole exchange is bounded by `limits.timeout_s`, the call by
    `call_deadline_s`, the answer by `limits.max_bytes` (see `_exchange`).
    Any answer is returned, error statuses included (the caller reads them);
    APIConnectionError (or APITimeoutError) when the last try got none.
    """
    deadline_s = call_deadline_s(policy, limits.timeout_s)
    deadline = None if deadline_s is None else time.monotonic() + deadline_s
    try:
        return policy.call(
            lambda: exchange(http, request, limits, deadline),
            statuses=request.retry_statuses,
            method=request.method,
            path=request.path,
            deadline_s=deadline_s,
        )
    except httpx.RequestError as exc:
        raise connection_error(exc) from exc


async def asend_with_retries(
    pool: AsyncPool, request: WireRequest, policy: RetryPolicy, limits: AnswerLimits
) -> Reply:
    """`send_with_retries` on an asyncio pool: the same tries, the same waits and bounds."""
    deadline_s = call_deadline_s(policy, limits.timeout_s)
    deadline = None if deadline_s is None else time.monotonic() + deadline_s
    try:
        return await policy.acall(
            lambda: pool.exchange(request, limits, deadline),
            statuses=request.retry_statuses,
            method=request.method,
            path=request.path,
            deadline_s=deadline_s,
        )
    except httpx.RequestError as exc:
        raise connection_error(exc) from exc
