"""The finalizer API clients: `FinalizerClient` (sync) and `AsyncFinalizerClient`.

Both have the same surface and behaviour; each owns one httpx connection pool
for its lifetime, so open one per process (or per event loop) and reuse it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterable
from types import TracebackType
from typing import Any

import httpx

from token_finalizer_client._constants import (
    DEFAULT_CONCURRENCY,
    DEFAULT_CONNECTION_LIMITS,
    DEFAULT_MAX_RETRIES,
    DEFAULT_TIMEOUT,
    RETRY_STATUSES,
)
from token_finalizer_client._exceptions import FinalizerError
from token_finalizer_client._ordered import ordered_map
from token_finalizer_client._retry import RetryBudget, connection_error
from token_finalizer_client._types import Finalized, Readiness
from token_finalizer_client._wire import (
    check_base_url,
    default_headers,
    encode_json,
    finalize_params,
    parse_answer,
    read_readiness,
    read_retired,
    retire_target,
)

__all__ = ["AsyncFinalizerClient", "FinalizerClient"]

# /ready answers 503 to say "not ready": an answer to report, not to repeat.
_NO_STATUS_RETRIES: frozenset[int] = frozenset()
_JSON_CONTENT = {"Content-Type": "application/json"}


class _Options:
    """Constructor checks shared by both clients."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None,
        timeout: float | httpx.Timeout | None,
        max_retries: int,
        run_id: str | None,
    ) -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.base_url = check_base_url(base_url)
        self.max_retries = max_retries
        self.run_id = run_id
        self.http_options: dict[str, Any] = {
            "base_url": self.base_url,
            "headers": default_headers(token, run_id),
            "timeout": timeout,
            "limits": DEFAULT_CONNECTION_LIMITS,
        }


class FinalizerClient:
    """Blocking client of the finalizer HTTP API.

    Retries connection errors and 502/503/504 up to `max_retries` times with
    jittered exponential backoff; every other error status raises the
    matching `APIStatusError` subclass at once. `run_id` is sent as `X-Run-Id`,
    which is how the service's mask-fraction guard tells runs apart.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float | httpx.Timeout | None = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        run_id: str | None = None,
    ) -> None:
        options = _Options(
            base_url, token=token, timeout=timeout, max_retries=max_retries, run_id=run_id
        )
        self.base_url = options.base_url
        self.max_retries = options.max_retries
        self.run_id = options.run_id
        self._http = httpx.Client(**options.http_options)

    def _send(
        self,
        method: str,
        path: str,
        *,
        payload: Any = None,
        params: dict[str, str] | None = None,
        retry_statuses: Collection[int] = RETRY_STATUSES,
    ) -> httpx.Response:
        content = None if payload is None else encode_json(payload)
        headers = None if content is None else _JSON_CONTENT
        budget = RetryBudget(self.max_retries, statuses=retry_statuses)
        while True:
            try:
                response = self._http.request(
                    method, path, content=content, params=params, headers=headers
                )
            except httpx.RequestError as exc:
                delay = budget.after_error(exc)
                if delay is None:
                    raise connection_error(exc) from exc
            else:
                delay = budget.after_response(response)
                if delay is None:
                    return response
            time.sleep(delay)

    def finalize(self, record: dict[str, Any], *, source: str | None = None) -> Finalized:
        """Finalize one finished rollout record (`POST /finalize`).

        Capture problems are not errors: they come back as a masked record.
        `source` names a configured source; the service's default otherwise.
        """
        response = self._send("POST", "/finalize", payload=record, params=finalize_params(source))
        return Finalized.from_answer(parse_answer(response))

    def retire(
        self,
        finalized: Finalized | None = None,
        *,
        rollout_id: str | None = None,
        build: dict[str, Any] | None = None,
        source: str | None = None,
    ) -> bool:
        """Retire the capture a finalize consumed (`POST /retire`); True when dropped.

        Call it only once the finalized record is stored durably. Pass the
        `Finalized`, or `rollout_id=` and `build=` from a stored answer. A
        `Finalized` that is not retirable returns False without a request.
        """
        payload = retire_target(finalized, rollout_id, build, source)
        if payload is None:
            return False
        return read_retired(parse_answer(self._send("POST", "/retire", payload=payload)))

    def health(self) -> dict[str, Any]:
        """`GET /health`: `{"status": "ok"}` while the service runs."""
        return parse_answer(self._send("GET", "/health"))

    def ready(self) -> Readiness:
        """`GET /ready`: whether every configured source is reachable, with details."""
        return read_readiness(self._send("GET", "/ready", retry_statuses=_NO_STATUS_RETRIES))

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


class AsyncFinalizerClient:
    """Asyncio client of the finalizer HTTP API; same surface as `FinalizerClient`.

    Adds `finalize_many` (and its streaming form `finalize_iter`) to finalize
    a batch with bounded concurrency, results in input order.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float | httpx.Timeout | None = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        run_id: str | None = None,
    ) -> None:
        options = _Options(
            base_url, token=token, timeout=timeout, max_retries=max_retries, run_id=run_id
        )
        self.base_url = options.base_url
        self.max_retries = options.max_retries
        self.run_id = options.run_id
        self._http = httpx.AsyncClient(**options.http_options)

    async def _send(
        self,
        method: str,
        path: str,
        *,
        payload: Any = None,
        params: dict[str, str] | None = None,
        retry_statuses: Collection[int] = RETRY_STATUSES,
    ) -> httpx.Response:
        content = None if payload is None else encode_json(payload)
        headers = None if content is None else _JSON_CONTENT
        budget = RetryBudget(self.max_retries, statuses=retry_statuses)
        while True:
            try:
                response = await self._http.request(
                    method, path, content=content, params=params, headers=headers
                )
            except httpx.RequestError as exc:
                delay = budget.after_error(exc)
                if delay is None:
                    raise connection_error(exc) from exc
            else:
                delay = budget.after_response(response)
                if delay is None:
                    return response
            await asyncio.sleep(delay)

    async def finalize(self, record: dict[str, Any], *, source: str | None = None) -> Finalized:
        """Finalize one finished rollout record (`POST /finalize`); see `FinalizerClient`."""
        response = await self._send(
            "POST", "/finalize", payload=record, params=finalize_params(source)
        )
        return Finalized.from_answer(parse_answer(response))

    async def finalize_iter(
        self,
        records: Iterable[dict[str, Any]],
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        source: str | None = None,
        return_exceptions: bool = False,
    ) -> AsyncIterator[Finalized | FinalizerError]:
        """Yield each record's `Finalized` in input order, `concurrency` requests at a time.

        Streams: `records` is read lazily and answers are not kept, so a batch
        of any size runs in bounded memory. With `return_exceptions`, a
        record's FinalizerError is yielded in its place instead of ending the
        iteration. Close the iterator when leaving early (`contextlib.aclosing`)
        so the requests still running are cancelled.
        """

        async def one(record: dict[str, Any]) -> Finalized:
            return await self.finalize(record, source=source)

        capture = (FinalizerError,) if return_exceptions else ()
        async with contextlib.aclosing(
            ordered_map(one, records, concurrency=concurrency, capture=capture)
        ) as outcomes:
            async for outcome in outcomes:
                yield outcome  # type: ignore[misc]

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

    async def retire(
        self,
        finalized: Finalized | None = None,
        *,
        rollout_id: str | None = None,
        build: dict[str, Any] | None = None,
        source: str | None = None,
    ) -> bool:
        """Retire the capture a finalize consumed (`POST /retire`); see `FinalizerClient`."""
        payload = retire_target(finalized, rollout_id, build, source)
        if payload is None:
            return False
        response = await self._send("POST", "/retire", payload=payload)
        return read_retired(parse_answer(response))

    async def health(self) -> dict[str, Any]:
        """`GET /health`: `{"status": "ok"}` while the service runs."""
        return parse_answer(await self._send("GET", "/health"))

    async def ready(self) -> Readiness:
        """`GET /ready`: whether every configured source is reachable, with details."""
        response = await self._send("GET", "/ready", retry_statuses=_NO_STATUS_RETRIES)
        return read_readiness(response)

    async def close(self) -> None:
        """Close the connection pool; safe to call twice."""
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
