"""`HttpTokenSink`: the writer side of a remote capture store (protocol v1, docs/store-protocol.md).

A model server records each call's exact tokens while a rollout runs:

    sink = HttpTokenSink(url="http://capture-store:8100", token=...)
    await sink.begin_call("3-0", "call-1")       # optional; if never put, the capture is incomplete
    await sink.put(entry)                        # a dict or a pydantic model (model_dump)
    await sink.mark_incomplete("3-0", "call-2")  # that call failed to capture
    await sink.close()

The constructor takes keyword arguments only, so a NeMo Gym model server can
name this class as its `token_id_capture.sink` with `sink_kwargs`. Every call
is safe to repeat (a put of the same payload is a no-op), so connection
trouble and 502/503/504 are retried; any refusal raises, never passes silently.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import httpx

from token_finalizer_client._constants import DEFAULT_CONNECTION_LIMITS, DEFAULT_MAX_RETRIES
from token_finalizer_client._exceptions import FinalizerError
from token_finalizer_client._retry import RetryPolicy, asend_with_retries
from token_finalizer_client._wire import WireRequest, check_base_url, default_headers, parse_answer

__all__ = ["HttpTokenSink"]

# The store's id rule (ASCII letters, digits, '.', '_', '-'; not '.' or '..'):
# checked here so a bad id fails before any request, with the same wording.
_STORE_ID = re.compile(r"[A-Za-z0-9._-]+", re.ASCII)
_CAPTURE_PATH = "training-token-capture"
# A connect that takes long means the store is gone; a put may take a while to fsync.
_CONNECT_TIMEOUT_S = 5.0


def _check_id(value: object, what: str) -> str:
    if not isinstance(value, str) or not _STORE_ID.fullmatch(value) or value in {".", ".."}:
        raise ValueError(
            f"{what} {value!r} must be a non-empty string of ASCII letters, digits, '.', '_' or '-'"
        )
    return value


def _entry_payload(entry: object) -> dict[str, Any]:
    if isinstance(entry, Mapping):
        return dict(entry)
    dump = getattr(entry, "model_dump", None)
    if callable(dump):
        # Plain mode: JSON mode would turn a -inf log probability into null.
        payload = dump()
        if isinstance(payload, dict):
            return payload
    raise TypeError(f"entry must be a mapping or a pydantic model, got {type(entry).__name__}")


class HttpTokenSink:
    """TokenSink that writes into a remote capture store over HTTP."""

    def __init__(
        self,
        *,
        url: str,
        token: str | None = None,
        timeout: float = 10.0,
        max_retries: int = DEFAULT_MAX_RETRIES,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._retry = RetryPolicy(max_retries)
        self.max_retries = max_retries
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.url = check_base_url(url)
        self._headers = default_headers(token, None)
        self._timeout = httpx.Timeout(timeout, connect=min(timeout, _CONNECT_TIMEOUT_S))
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._closed = False

    def __repr__(self) -> str:  # never shows the token
        return f"HttpTokenSink(url={self.url!r})"

    async def __aenter__(self) -> HttpTokenSink:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _http(self) -> httpx.AsyncClient:
        if self._closed:
            raise FinalizerError(f"{self!r} is closed")
        if self._client is None:
            # Created on first use, inside the model server's event loop.
            self._client = httpx.AsyncClient(
                base_url=self.url,
                headers=self._headers,
                timeout=self._timeout,
                limits=DEFAULT_CONNECTION_LIMITS,
                transport=self._transport,
            )
        return self._client

    async def _send(self, method: str, rollout_id: str, operation: str, payload: Any) -> Any:
        path = f"/ng-rollout/{rollout_id}/{_CAPTURE_PATH}/{operation}"
        request = WireRequest.json(method, path, payload)
        return parse_answer(await asend_with_retries(self._http(), request, self._retry))

    async def put(self, entry: Mapping[str, Any] | Any) -> None:
        """Store one call's TokenEntry (a dict or a pydantic model).

        The same payload again is a no-op. Raises ConflictError for a different
        payload under the same call id or a put after freeze, BadRequestError
        for an entry the store refuses, APIConnectionError when it is unreachable.
        """
        payload = _entry_payload(entry)
        rollout_id = _check_id(payload.get("rollout_id"), "rollout_id")
        call_id = _check_id(payload.get("model_call_id"), "model_call_id")
        await self._send("PUT", rollout_id, f"calls/{call_id}", payload)

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        """Record that a call of this rollout failed to capture ("" for the rollout as a whole)."""
        _check_id(rollout_id, "rollout_id")
        if model_call_id:
            _check_id(model_call_id, "model_call_id")
        await self._send("POST", rollout_id, "incomplete", {"model_call_id": model_call_id})

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        """Announce a call: if its entry is missing at freeze time, the snapshot is incomplete."""
        _check_id(rollout_id, "rollout_id")
        _check_id(model_call_id, "model_call_id")
        await self._send("POST", rollout_id, "intents", {"model_call_id": model_call_id})

    async def close(self) -> None:
        """Close the connection pool; safe to call twice."""
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
