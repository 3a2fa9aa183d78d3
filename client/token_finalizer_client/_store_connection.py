"""Connections to a remote capture store (protocol v1): how a pool is opened, and one connection.

`StoreEndpoint` is the one place where a pool to a store gets its base URL,
headers (bearer token, compression), timeouts and limits: the writer sink,
the lineage resolver, the capture ledger, the staging sink and source
(`_blocking_store`) and the service's `http` source all open theirs from it,
each with its own numbers. `StoreConnection` is the sink's and the resolver's
shared base: built by a NeMo Gym model server from keyword arguments, it opens
a pool in each event loop it is used from, on first use there (`_loop_pools`), sizes it for the
server's concurrency (256 connections, all kept alive, by default), sends every
call through the package's one retry policy with each try's whole exchange
bounded by `timeout` and each answer by `DEFAULT_STORE_MAX_ANSWER_BYTES`, and
never shows its token. Both kinds of connection keep what their store
advertises at `GET /capabilities` (`_capabilities`): asked once per
connection, shared by every caller, forgotten after a store refused an
extension, so every extension is used only where the store serves it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from token_finalizer_client._aio_pool import AioPool
from token_finalizer_client._capabilities import CAPABILITIES_PATH, Probe, StoreCapabilities
from token_finalizer_client._constants import (
    ACCEPT_ENCODING,
    CONNECT_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_KEEPALIVE,
    DEFAULT_MAX_RETRIES,
    DEFAULT_STORE_MAX_ANSWER_BYTES,
    DEFAULT_STORE_MAX_CONNECTIONS,
    DEFAULT_STORE_MAX_KEEPALIVE,
    DEFAULT_STORE_TIMEOUT_S,
    STORE_KEEPALIVE_EXPIRY_S,
)
from token_finalizer_client._deadline import bound_by_deadlines
from token_finalizer_client._exceptions import ClientClosedError
from token_finalizer_client._exchange import AnswerLimits, AsyncPool, HttpxAsyncPool, Reply
from token_finalizer_client._loop_pools import LoopPools
from token_finalizer_client._retry import RetryPolicy, asend_with_retries
from token_finalizer_client._url_credentials import masked, sent_as_auth
from token_finalizer_client._wire import WireRequest, default_headers

__all__ = ["CAPABILITIES_REQUEST", "PROBE_RETRY", "PooledStore", "StoreConnection", "StoreEndpoint"]

# The capabilities probe: tried once (a probe that gets no answer means plain v1
# for that call, and the next call asks again), no status repeated.
CAPABILITIES_REQUEST = WireRequest("GET", CAPABILITIES_PATH, retry_statuses=frozenset())
PROBE_RETRY = RetryPolicy(0)


@dataclass(frozen=True, slots=True)
class StoreEndpoint:
    """One capture store as a client reaches it: everything its connection pool is opened with."""

    url: str
    headers: Mapping[str, str]
    timeout: httpx.Timeout
    limits: httpx.Limits

    @classmethod
    def create(
        cls,
        url: str,
        *,
        token: str | None = None,
        timeout_s: float = DEFAULT_STORE_TIMEOUT_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_keepalive: int = DEFAULT_MAX_KEEPALIVE,
        accept_encoding: str = ACCEPT_ENCODING,
    ) -> StoreEndpoint:
        """The endpoint at `url` (trailing slash dropped); ValueError for a bad argument.

        `timeout_s` bounds each read, write and pool wait; a connect gets at
        most `CONNECT_TIMEOUT_S` of it, since a connect that takes long means
        the store is gone, while a large snapshot may take long to arrive.
        User info in `url` is sent as Basic auth unless a `token` is given
        (`_url_credentials`); `url` keeps none of it.
        """
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            shown = masked(url) if isinstance(url, str) else url
            raise ValueError(f"url {shown!r} must start with http:// or https://")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        headers = default_headers(token, None)
        bare = sent_as_auth(url, headers)
        headers["Accept-Encoding"] = accept_encoding
        return cls(
            url=bare.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, CONNECT_TIMEOUT_S)),
            limits=httpx.Limits(
                max_connections=max_connections,
                max_keepalive_connections=max_keepalive,
                keepalive_expiry=STORE_KEEPALIVE_EXPIRY_S,
            ),
        )

    def __repr__(self) -> str:  # never shows the token
        return f"{type(self).__name__}(url={self.url!r})"

    def open(self, transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
        """A new asyncio connection pool to this store (`transport` replaces the network)."""
        return httpx.AsyncClient(
            base_url=self.url,
            headers=self.headers,
            timeout=self.timeout,
            limits=self.limits,
            transport=transport,
        )

    def open_pool(self, transport: httpx.AsyncBaseTransport | None = None) -> AsyncPool:
        """A new asyncio pool to this store: aiohttp on the network, httpx over `transport`.

        A store connection's requests are a model server's hot path; aiohttp
        is the faster client there (`_aio_pool`). A transport (an in-process
        app, a mock) is httpx's seam, so with one the pool is httpx's.
        """
        if transport is not None:
            return HttpxAsyncPool(self.open(transport))
        return AioPool(self.url, self.headers, self.timeout, self.limits)

    def open_blocking(self, transport: httpx.BaseTransport | None = None) -> httpx.Client:
        """A new blocking connection pool to this store, safe to share between threads.

        Every socket operation of a try ends by the try's deadline (`_deadline`).
        """
        pool = httpx.Client(
            base_url=self.url,
            headers=self.headers,
            timeout=self.timeout,
            limits=self.limits,
            transport=transport,
        )
        bound_by_deadlines(pool)
        return pool


class PooledStore:
    """What both store connections (asyncio and blocking) set up alike.

    The retry policy, the endpoint their pool is opened from, the limits of
    each answer and the URL; the arguments are checked here, each ValueError
    naming the caller's argument.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None,
        timeout: float,
        max_retries: int,
        max_connections: int,
        max_keepalive: int,
        max_answer_bytes: int,
    ) -> None:
        self._retry = RetryPolicy(max_retries)
        self.max_retries = max_retries
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if max_connections < 1 or not 0 <= max_keepalive <= max_connections:
            raise ValueError(
                "the pool needs max_connections >= 1 and 0 <= max_keepalive <= max_connections, "
                f"got {max_connections} and {max_keepalive}"
            )
        if max_answer_bytes < 1:
            raise ValueError(f"max_answer_bytes must be positive, got {max_answer_bytes}")
        self._endpoint = StoreEndpoint.create(
            url,
            token=token,
            timeout_s=timeout,
            max_connections=max_connections,
            max_keepalive=max_keepalive,
        )
        self._limits = AnswerLimits(timeout_s=timeout, max_bytes=max_answer_bytes)
        # Shown in reprs and log lines: a password the URL holds is masked.
        self.url = masked(url.rstrip("/"))
        self._capabilities = StoreCapabilities()

    def _forget_capabilities(self) -> None:
        """Ask the store's features again on next use: it refused a request using one.

        Called after a 404, 405 or 422 to a request that used an extension
        (docs/store-protocol.md#extensions-and-capabilities).
        """
        self._capabilities.forget()

    def __repr__(self) -> str:  # never shows the token
        return f"{type(self).__name__}(url={self.url!r})"


class StoreConnection(PooledStore):
    """The pooled, retried, bounded HTTP connection to one capture store.

    `timeout` bounds each try's whole exchange (connect, send, every byte of
    the answer); a call takes at most its tries plus the waits between them.
    `max_connections` and `max_keepalive` size the pool for the model
    server's concurrency.
    """

    def __init__(
        self,
        *,
        url: str,
        token: str | None = None,
        timeout: float = DEFAULT_STORE_TIMEOUT_S,
        max_retries: int = DEFAULT_MAX_RETRIES,
        max_connections: int = DEFAULT_STORE_MAX_CONNECTIONS,
        max_keepalive: int = DEFAULT_STORE_MAX_KEEPALIVE,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(
            url,
            token=token,
            timeout=timeout,
            max_retries=max_retries,
            max_connections=max_connections,
            max_keepalive=max_keepalive,
            max_answer_bytes=DEFAULT_STORE_MAX_ANSWER_BYTES,
        )
        self._transport = transport
        # One pool per event loop, opened on first use there (docs/architecture.md#event-loops).
        self._pools = LoopPools(lambda: self._endpoint.open_pool(self._transport))
        self._closed = False

    def _http(self) -> AsyncPool:
        if self._closed:
            raise ClientClosedError(f"{self!r} is closed")
        return self._pools.current()

    async def _call(self, request: WireRequest) -> Reply:
        """`request` sent through the retry policy, its answer read whole within the limits."""
        return await asend_with_retries(self._http(), request, self._retry, self._limits)

    async def _supports(self, feature: str) -> bool:
        """Whether the store advertises `feature` (asked once per connection, then kept)."""
        return await self._capabilities.asupports(feature, self._probe_capabilities)

    async def _probe_capabilities(self) -> Probe:
        reply = await asend_with_retries(
            self._http(), CAPABILITIES_REQUEST, PROBE_RETRY, self._limits
        )
        return reply.status_code, reply.content

    async def close(self) -> None:
        """Close the running loop's pool (and hand each other loop's to it); safe to call twice.

        Any call afterwards raises `ClientClosedError` (a FinalizerError).
        """
        self._closed = True
        await self._pools.aclose()
