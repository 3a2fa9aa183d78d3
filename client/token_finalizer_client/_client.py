"""The finalizer API clients: `FinalizerClient` (sync) and `AsyncFinalizerClient`.

Both have the same surface and behaviour; open one per process and reuse it.
`FinalizerClient` owns one httpx connection pool, shared by every thread;
`AsyncFinalizerClient` one per event loop it is used from, opened on first
use there and closed with that loop (`_loop_pools`).
What they send and how they read answers lives in `_wire`, when to repeat a
call in `_retry` (the project's one retry policy), how one try is bounded in
`_exchange`: the two classes only add the blocking or asyncio transport.

`timeout` bounds each try's whole exchange: connecting, sending, and every
byte of the answer, its head included (a server trickling its answer cannot
hold a call longer); a call takes at most its tries plus the waits between
them. An `httpx.Timeout` sets httpx's per-operation timeouts instead, and its
`read` value bounds each try's exchange. Answers are read up to
`DEFAULT_MAX_ANSWER_BYTES` once decoded (docs/architecture.md#bounded-answers).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Generic, TypeVar

import httpx

from token_finalizer_client._compact import load_numpy
from token_finalizer_client._constants import (
    CONNECT_TIMEOUT_S,
    DEFAULT_CONCURRENCY,
    DEFAULT_MAX_ANSWER_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_KEEPALIVE,
    DEFAULT_MAX_RETRIES,
    DEFAULT_TIMEOUT_S,
)
from token_finalizer_client._deadline import bound_by_deadlines
from token_finalizer_client._exceptions import ClientClosedError, FinalizerError
from token_finalizer_client._exchange import AnswerLimits, AsyncPool, HttpxAsyncPool, Reply
from token_finalizer_client._loop_pools import LoopPools
from token_finalizer_client._ordered import ordered_map
from token_finalizer_client._retry import RetryPolicy, asend_with_retries, send_with_retries
from token_finalizer_client._types import Finalized, Readiness
from token_finalizer_client._url_credentials import masked, sent_as_auth
from token_finalizer_client._wire import (
    HEALTH_REQUEST,
    READY_REQUEST,
    WireRequest,
    check_base_url,
    default_headers,
    finalize_request,
    read_finalized,
    read_object,
    read_readiness,
    read_retired,
    retire_request,
)

__all__ = ["AsyncFinalizerClient", "FinalizerClient"]

_Pool = TypeVar("_Pool", httpx.Client, LoopPools)

DEFAULT_TIMEOUT = httpx.Timeout(DEFAULT_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
_LIMITS = httpx.Limits(
    max_connections=DEFAULT_MAX_CONNECTIONS, max_keepalive_connections=DEFAULT_MAX_KEEPALIVE
)


def _exchange_timeout(timeout: float | httpx.Timeout | None) -> float | None:
    """How long one try's whole exchange may take, from the client's `timeout`."""
    if isinstance(timeout, httpx.Timeout):
        return timeout.read
    return timeout


class _BaseClient(Generic[_Pool]):
    """Construction shared by both clients: argument checks, headers, pool options."""

    _http: _Pool

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float | httpx.Timeout | None = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        run_id: str | None = None,
        as_numpy: bool = False,
    ) -> None:
        self._retry = RetryPolicy(max_retries)
        self.max_retries = max_retries
        # Shown as given with its user info masked; sent without it (`_url_credentials`).
        self.base_url = masked(check_base_url(base_url))
        headers = default_headers(token, run_id)
        bare = sent_as_auth(check_base_url(base_url), headers)
        self.run_id = run_id
        if as_numpy:
            load_numpy()  # ImportError now, not at the first answer
        self.as_numpy = as_numpy
        self._limits = AnswerLimits(
            timeout_s=_exchange_timeout(timeout), max_bytes=DEFAULT_MAX_ANSWER_BYTES
        )
        self._http = self._open_pool(
            base_url=bare,
            headers=headers,
            timeout=timeout,
            limits=_LIMITS,
        )

    def _open_pool(self, **options: Any) -> _Pool:
        raise NotImplementedError


class FinalizerClient(_BaseClient[httpx.Client]):
    """Blocking client of the finalizer HTTP API.

    Retries connection errors and 502/503/504 up to `max_retries` times with
    jittered exponential backoff; every other error status raises the
    matching `APIStatusError` subclass at once. `run_id` is sent as `X-Run-Id`,
    which is how the service's mask-fraction guard tells runs apart.

    Finalize answers are asked for in the compact token form and expanded
    into the standard record: token lists by default, or with `as_numpy`
    numpy arrays whose prompts are views of one shared, read-only int64
    array (uint64 when an id of the record needs it; needs numpy: the
    `fast` extra, `token-finalizer-client[fast]`).
    """

    def _open_pool(self, **options: Any) -> httpx.Client:
        pool = httpx.Client(**options)
        # Every socket operation of a try then ends by the try's deadline (`_deadline`).
        bound_by_deadlines(pool)
        return pool

    def _send(self, request: WireRequest) -> Reply:
        return send_with_retries(self._http, request, self._retry, self._limits)

    def finalize(self, record: dict[str, Any], *, source: str | None = None) -> Finalized:
        """Finalize one finished rollout record (`POST /finalize`).

        Capture problems are not errors: they come back as a masked record.
        `source` names a configured source; the service's default otherwise.
        """
        request = finalize_request(record, source)
        return read_finalized(self._send(request), as_numpy=self.as_numpy)

    def retire(self, finalized: Finalized | Mapping[str, Any] | None) -> bool:
        """Retire the snapshot a finalize consumed (`POST /retire`); True when dropped.

        Call it only once the finalized record is stored durably. Pass the
        `Finalized`, or a stored answer's `retire` object (or the whole
        stored answer): only the `retire` object is sent. Without one (None,
        or a masked or failed result) it returns False without a request.
        False also when the store moved on since the finalize (409, stale
        snapshot): nothing was dropped. Repeating a successful retire is
        True again. A ticket that does not verify raises
        PermissionDeniedError (403), a malformed one BadRequestError (422).
        """
        request = retire_request(finalized)
        return False if request is None else read_retired(self._send(request))

    def health(self) -> dict[str, Any]:
        """`GET /health`: `{"status": "ok"}` while the service runs."""
        return read_object(self._send(HEALTH_REQUEST))

    def ready(self) -> Readiness:
        """`GET /ready`: whether every configured source is reachable, with details."""
        return read_readiness(self._send(READY_REQUEST))

    def close(self) -> None:
        """Close the connection pool; safe to call twice."""
        self._http.close()

    def __enter__(self) -> FinalizerClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class AsyncFinalizerClient(_BaseClient[LoopPools]):
    """Asyncio client of the finalizer HTTP API; same surface as `FinalizerClient`.

    Adds `finalize_many` (and its streaming form `finalize_iter`) to finalize
    a batch with bounded concurrency, results in input order.
    """

    _closed = False

    def _open_pool(self, **options: Any) -> LoopPools:
        def open_one() -> AsyncPool:
            return HttpxAsyncPool(httpx.AsyncClient(**options))

        # One httpx pool per event loop, opened there (docs/architecture.md#event-loops).
        return LoopPools(open_one)

    @property
    def closed(self) -> bool:
        """Whether `close()` was called: every call afterwards raises `ClientClosedError`."""
        return self._closed

    async def _send(self, request: WireRequest) -> Reply:
        if self._closed:
            raise ClientClosedError(f"this {type(self).__name__} is closed")
        pool = self._http.current()
        return await asend_with_retries(pool, request, self._retry, self._limits)

    async def finalize(self, record: dict[str, Any], *, source: str | None = None) -> Finalized:
        """Finalize one finished rollout record (`POST /finalize`); see `FinalizerClient`."""
        request = finalize_request(record, source)
        return read_finalized(await self._send(request), as_numpy=self.as_numpy)

    async def finalize_iter(
        self,
        records: Iterable[dict[str, Any]],
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        source: str | None = None,
        return_exceptions: bool = False,
    ) -> AsyncGenerator[Finalized | FinalizerError, None]:
        """Yield each record's `Finalized` in input order, `concurrency` requests at a time.

        Streams: `records` is read lazily and answers are not kept, so a batch
        of any size runs in bounded memory. With `return_exceptions`, a
        record's FinalizerError is yielded in its place instead of ending the
        iteration. Close the iterator when leaving early (`contextlib.aclosing`)
        so the requests still running are cancelled.
        """

        async def one(record: dict[str, Any]) -> Finalized:
            return await self.finalize(record, source=source)

        capture: tuple[type[FinalizerError], ...] = (FinalizerError,) if return_exceptions else ()
        async with contextlib.aclosing(
            ordered_map(one, records, concurrency=concurrency, capture=capture)
        ) as outcomes:
            async for outcome in outcomes:
                yield outcome

    async def finalize_many(
        self,
        records: Iterable[dict[str, Any]],
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        source: str | None = None,
        on_result: Callable[[int, Finalized | FinalizerError], Any] | None = None,
        return_exceptions: bool = False,
    ) -> list[Finalized | FinalizerError]:
        """Finalize a batch with at most `concurrency` requests in flight; results in input order.

        `on_result(index, result)` is called for each result as soon as it and
        every earlier one are done (input order), e.g. to write it out; a
        coroutine function is awaited. The first error raises and cancels the
        rest, unless `return_exceptions` puts each record's FinalizerError in
        its place in the list. All results are kept: for batches too large for
        memory, iterate `finalize_iter` instead.
        """
        results: list[Finalized | FinalizerError] = []
        async with contextlib.aclosing(
            self.finalize_iter(
                records,
                concurrency=concurrency,
                source=source,
                return_exceptions=return_exceptions,
            )
        ) as outcomes:
            async for outcome in outcomes:
                if on_result is not None:
                    handled = on_result(len(results), outcome)
                    if inspect.isawaitable(handled):
                        await handled
                results.append(outcome)
        return results

    async def retire(self, finalized: Finalized | Mapping[str, Any] | None) -> bool:
        """Retire the snapshot a finalize consumed (`POST /retire`); see `FinalizerClient`."""
        request = retire_request(finalized)
        return False if request is None else read_retired(await self._send(request))

    async def health(self) -> dict[str, Any]:
        """`GET /health`: `{"status": "ok"}` while the service runs."""
        return read_object(await self._send(HEALTH_REQUEST))

    async def ready(self) -> Readiness:
        """`GET /ready`: whether every configured source is reachable, with details."""
        return read_readiness(await self._send(READY_REQUEST))

    async def close(self) -> None:
        """Close the running loop's pool (each other loop's closes on its loop); safe twice.

        Every call afterwards raises `ClientClosedError` (a RuntimeError).
        """
        self._closed = True
        await self._http.aclose()

    async def __aenter__(self) -> AsyncFinalizerClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()
