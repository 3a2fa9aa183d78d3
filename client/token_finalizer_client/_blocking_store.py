"""A blocking connection to a capture store, shared by every thread of a process.

NeMo Gym's staging interfaces are synchronous: an inference worker stages
each call from its completion threads, several at once, and a trainer
fetches snapshots from plain code. `BlockingStoreConnection` is the base of
`HttpStagingSink` and `HttpStagingSource`: one `httpx.Client` for the
object's lifetime, opened on first use (after a worker process forks, not
before) under a lock so that racing threads share it, every call sent
through the package's one retry policy with each try's whole exchange
bounded by `timeout` and each answer by `max_answer_bytes`
(docs/architecture.md#bounded-answers). It never shows its token. What the
store advertises at `GET /capabilities` is asked once and shared by every
thread (`_supports`, `_capabilities`).
"""

from __future__ import annotations

import threading
from types import TracebackType

import httpx

from token_finalizer_client._capabilities import Probe
from token_finalizer_client._constants import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_STORE_MAX_ANSWER_BYTES,
    DEFAULT_STORE_MAX_CONNECTIONS,
    DEFAULT_STORE_MAX_KEEPALIVE,
    DEFAULT_STORE_TIMEOUT_S,
)
from token_finalizer_client._exceptions import FinalizerError
from token_finalizer_client._exchange import Reply
from token_finalizer_client._retry import send_with_retries
from token_finalizer_client._store_connection import (
    CAPABILITIES_REQUEST,
    PROBE_RETRY,
    PooledStore,
)
from token_finalizer_client._wire import WireRequest

__all__ = ["BlockingStoreConnection"]


class BlockingStoreConnection(PooledStore):
    """The pooled, retried, bounded blocking connection to one capture store.

    `timeout` bounds each try's whole exchange (connect, send, every byte of
    the answer); a call takes at most its tries plus the waits between them.
    `max_connections` and `max_keepalive` size the pool for the threads that
    share it. `transport` replaces the network (tests).
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_STORE_TIMEOUT_S,
        max_retries: int = DEFAULT_MAX_RETRIES,
        max_connections: int = DEFAULT_STORE_MAX_CONNECTIONS,
        max_keepalive: int = DEFAULT_STORE_MAX_KEEPALIVE,
        max_answer_bytes: int = DEFAULT_STORE_MAX_ANSWER_BYTES,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(
            url,
            token=token,
            timeout=timeout,
            max_retries=max_retries,
            max_connections=max_connections,
            max_keepalive=max_keepalive,
            max_answer_bytes=max_answer_bytes,
        )
        self._transport = transport
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> BlockingStoreConnection:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self._closed

    def _http(self) -> httpx.Client:
        client = self._client
        if client is not None and not self._closed:
            return client
        with self._lock:
            if self._closed:
                raise FinalizerError(f"{self!r} is closed")
            if self._client is None:
                self._client = self._endpoint.open_blocking(self._transport)
            return self._client

    def _call(self, request: WireRequest) -> Reply:
        """`request` sent through the retry policy, its answer read whole within the limits."""
        return send_with_retries(self._http(), request, self._retry, self._limits)

    def _supports(self, feature: str) -> bool:
        """Whether the store advertises `feature` (asked once for every thread, then kept)."""
        return self._capabilities.supports(feature, self._probe_capabilities)

    def _probe_capabilities(self) -> Probe:
        reply = send_with_retries(self._http(), CAPABILITIES_REQUEST, PROBE_RETRY, self._limits)
        return reply.status_code, reply.content

    def close(self) -> None:
        """Close the connection pool; safe to call twice, and from any thread."""
        with self._lock:
            self._closed = True
            client, self._client = self._client, None
        if client is not None:
            client.close()
