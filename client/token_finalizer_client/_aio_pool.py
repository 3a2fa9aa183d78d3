"""A store connection's pool on the network: aiohttp, under the package's exchange contract.

A NeMo Gym model server waits for its store before every model call (a
lineage resolve, `begin_call`, a `put`), so the cost of one request is on its
hot path. On loopback httpx's asyncio client spends about twice aiohttp's
time per request (its pure-Python connection pool and response layers);
aiohttp parses HTTP in C. A store connection therefore sends through this
pool unless it was given an httpx transport (docs/architecture.md#round-trips).

The contract is `_exchange`'s, unchanged: each try's whole exchange ends by
its deadline (`asyncio.timeout`), the raw body is read up to the limit and
decoded by `_decoding` (aiohttp's own decompression is off), and an error
answer is read up to `MAX_ERROR_BODY_BYTES`. aiohttp's errors become the
httpx errors of the same meaning, so the one retry policy (`_retry`) tells
transient failures from the rest exactly as it does for httpx; a ValueError
aiohttp raises for a request it cannot send becomes `httpx.LocalProtocolError`
(so `APIConnectionError`, never a bare ValueError a ledger caller would read
as a conflict). The environment counts for its proxy only (`_env_proxy`):
never `.netrc`, whose password aiohttp's `trust_env` would send (issue 29).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from urllib.parse import urlencode

import aiohttp
import httpx
from yarl import URL

from token_finalizer_client._env_proxy import environment_proxy
from token_finalizer_client._exchange import (
    AnswerBody,
    AnswerLimits,
    Reply,
    timed_out,
    try_deadline,
)
from token_finalizer_client._url_credentials import masked
from token_finalizer_client._wire import WireRequest

__all__ = ["AioPool"]


def _error_type(exc: Exception) -> type[httpx.TransportError]:
    """The httpx error that means what `exc` means (`_retry.TRANSIENT_ERRORS` reads it)."""
    if isinstance(exc, aiohttp.ClientConnectorError):  # before ClientOSError, its base
        return httpx.ConnectError
    if isinstance(
        exc,
        aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError | aiohttp.ClientResponseError,
    ):
        return httpx.RemoteProtocolError
    if isinstance(exc, aiohttp.InvalidURL):
        return httpx.UnsupportedProtocol
    if isinstance(exc, aiohttp.ClientConnectionError | OSError):
        return httpx.ReadError
    if isinstance(exc, ValueError):  # a request aiohttp will not send (a header, a proxy)
        return httpx.LocalProtocolError
    return httpx.TransportError


class AioPool:
    """An `AsyncPool` (`_exchange`) of aiohttp connections to one store.

    Opened on first use, inside the running event loop; `limits` sizes it
    (aiohttp keeps every connection of the pool alive, for at most
    `keepalive_expiry` seconds idle), `timeout` bounds a connect and each
    read when a try has no deadline of its own.
    """

    def __init__(
        self,
        base_url: str,
        headers: Mapping[str, str],
        timeout: httpx.Timeout,
        limits: httpx.Limits,
    ) -> None:
        self._base = base_url
        parsed = httpx.URL(base_url)
        # Messages name the call by scheme, host, port and path: never the credentials.
        self._origin = f"{parsed.scheme}://{parsed.netloc.decode('ascii')}{parsed.path.rstrip('/')}"
        self._headers = dict(headers)
        self._timeout = timeout
        self._limits = limits
        self._session: aiohttp.ClientSession | None = None
        self._proxy: str | None = None

    def _open(self) -> aiohttp.ClientSession:
        limits = self._limits
        self._proxy = environment_proxy(self._base)
        if self._proxy is not None and not self._proxy.startswith(("http://", "https://")):
            # aiohttp would speak HTTP to it (a socks5:// proxy): refused, as a ValueError.
            raise ValueError(f"proxy {masked(self._proxy)!r} is not an http(s) proxy")
        connector = aiohttp.TCPConnector(
            limit=limits.max_connections or 0,
            limit_per_host=0,
            keepalive_timeout=limits.keepalive_expiry,
            force_close=limits.max_keepalive_connections == 0,
        )
        return aiohttp.ClientSession(
            connector=connector,
            headers=self._headers,
            auto_decompress=False,  # bodies are decoded under the limit (`_decoding`)
            # Never .netrc; the proxy comes from `environment_proxy`, as httpx's would.
            trust_env=False,
            timeout=aiohttp.ClientTimeout(
                sock_connect=self._timeout.connect, sock_read=self._timeout.read
            ),
        )

    def _url(self, request: WireRequest) -> URL:
        query = f"?{urlencode(request.params)}" if request.params else ""
        # The path arrives percent-encoded (`_addressing`): sent exactly as it is.
        return URL(f"{self._base}{request.path}{query}", encoded=True)

    async def exchange(
        self, request: WireRequest, limits: AnswerLimits, call_deadline: float | None
    ) -> Reply:
        """Send `request` once and read its answer whole, within the try's deadline."""
        name = f"{request.method} {self._origin}{request.path}"
        deadline = try_deadline(limits, call_deadline)
        left = None if deadline is None else deadline - time.monotonic()
        try:
            if left is not None and left <= 0:
                raise TimeoutError
            async with asyncio.timeout(left):
                return await self._read(request, limits, name)
        except TimeoutError:  # the try's deadline, or aiohttp's own socket timeouts
            raise timed_out(self._described(request), limits) from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            detail = masked(str(exc)) or type(exc).__name__  # a proxy URL's password too
            raise _error_type(exc)(detail, request=self._described(request)) from exc

    async def _read(self, request: WireRequest, limits: AnswerLimits, name: str) -> Reply:
        if self._session is None:
            self._session = self._open()
        async with self._session.request(
            request.method,
            self._url(request),
            data=request.content,
            headers=request.own_headers(),
            allow_redirects=False,
            proxy=self._proxy,
        ) as response:
            body = AnswerBody(200 <= response.status < 300, limits, name, decoded=False)
            async for chunk in response.content.iter_any():
                if not body.add(chunk):
                    break
            return body.reply(response.status, response.headers)

    def _described(self, request: WireRequest) -> httpx.Request:
        # Only for an error: it carries the call's method and URL into the message.
        return httpx.Request(request.method, f"{self._base}{request.path}")

    async def aclose(self) -> None:
        """Close every connection; safe to call twice."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def forget(self) -> None:
        """Close the session of a loop that has closed, without running anything on that loop.

        aiohttp's close finds the loop closed and has nothing to wait for, so
        its coroutine ends at its first step; should it ever need the loop,
        the session is detached instead. Either way it counts as closed: no
        "Unclosed client session" when it is collected (`_loop_pools`).
        """
        session, self._session = self._session, None
        if session is None:
            return
        closing = session.close()
        try:
            closing.send(None)
        except StopIteration:
            return
        except Exception:  # a connector that cannot close off its loop: nothing to save
            pass
        closing.close()
        session.detach()
