"""The store connections' network pool (aiohttp) keeps the package's exchange contract.

Against real servers on loopback: what goes on the wire, how answers are read
and which httpx error each failure becomes (the retry policy reads those).
Bombs, trickles and enormous error messages are tests/client/test_exchange.py,
through the resolver and the sink, which use this pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import httpx
import pytest

from tests.client.hostile_server import Canned, HostileServer
from tests.support.loopback_http import read_request, serving
from tests.support.servers import free_port
from token_finalizer_client import APIConnectionError, HttpTokenSink
from token_finalizer_client._aio_pool import AioPool, _error_type
from token_finalizer_client._exchange import AnswerLimits, ExchangeTimeout, HttpxAsyncPool
from token_finalizer_client._wire import WireRequest
from token_finalizer_client.transport import StoreEndpoint

pytestmark = pytest.mark.anyio

LIMITS = AnswerLimits(timeout_s=5.0, max_bytes=1024)


def _pool(url: str, token: str | None = None) -> AioPool:
    pool = StoreEndpoint.create(url, token=token).open_pool()
    assert isinstance(pool, AioPool)
    return pool


@pytest.fixture
async def canned() -> AsyncIterator[tuple[HostileServer, str]]:
    """A server answering 200 `{"ok":true}` to every request, and its URL."""
    server = HostileServer(Canned(200, b'{"ok":true}', {"content-type": "application/json"}))
    with server.running() as url:
        yield server, url


def test_a_transport_gives_an_httpx_pool_and_none_an_aiohttp_one() -> None:
    """An httpx transport (in-process app, mock) is httpx's seam; the network is aiohttp's."""
    endpoint = StoreEndpoint.create("http://store.test")
    assert isinstance(endpoint.open_pool(), AioPool)
    assert isinstance(
        endpoint.open_pool(httpx.MockTransport(lambda r: httpx.Response(200))), HttpxAsyncPool
    )


async def test_the_path_goes_out_exactly_as_encoded(canned: tuple[HostileServer, str]) -> None:
    """A percent-encoded id is sent as it is (never decoded or encoded twice), query after it."""
    server, url = canned
    pool = _pool(url + "/base")
    path = "/ng-rollout/r%2F1/training-token-capture/calls/c%20x"
    reply = await pool.exchange(
        WireRequest("GET", path, params={"tokens": "compact"}), LIMITS, None
    )
    await pool.aclose()
    assert server.requests == [f"GET /base{path}?tokens=compact"]
    assert (reply.status_code, reply.content) == (200, b'{"ok":true}')


async def test_every_request_carries_the_endpoints_headers() -> None:
    """Bearer token, JSON accept, the asked-for encodings and a JSON body's content type."""
    seen: list[dict[str, str]] = []

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_request(reader)
        assert request is not None
        seen.append(request[2])
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    with serving(connection) as url:
        pool = _pool(url, token="t0k")
        await pool.exchange(WireRequest.json("POST", "/x", {"a": 1}), LIMITS, None)
        await pool.aclose()
    headers = seen[0]
    assert (headers["authorization"], headers["accept"], headers["content-type"]) == (
        "Bearer t0k",
        "application/json",
        "application/json",
    )
    assert "zstd" in headers["accept-encoding"]


async def test_sequential_calls_share_one_kept_alive_connection() -> None:
    """The pool keeps its connection: three calls, one TCP connection."""
    connections: list[int] = []

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        while await read_request(reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
            await writer.drain()
        writer.close()

    with serving(connection) as url:
        pool = _pool(url)
        for _ in range(3):
            await pool.exchange(WireRequest("GET", "/health"), LIMITS, None)
        await pool.aclose()
    assert len(connections) == 1


async def test_an_answer_over_the_limit_is_refused(canned: tuple[HostileServer, str]) -> None:
    """A successful answer longer than the limit is an AnswerTooLargeError naming the call."""
    _, url = canned
    pool = _pool(url)
    with pytest.raises(Exception, match="answered more than 4 bytes") as raised:
        await pool.exchange(WireRequest("GET", "/big"), AnswerLimits(5.0, 4), None)
    await pool.aclose()
    assert type(raised.value).__name__ == "AnswerTooLargeError"


async def test_a_try_past_its_deadline_is_an_exchange_timeout() -> None:
    """A server that never answers ends the try at its deadline, as an httpx timeout."""
    server = HostileServer(Canned(200, b"{}", drip_head=True))
    with server.running() as url:
        pool = _pool(url)
        with pytest.raises(ExchangeTimeout) as raised:
            await pool.exchange(WireRequest("GET", "/slow"), AnswerLimits(0.3, 1024), None)
        await pool.aclose()
    assert isinstance(raised.value, httpx.TimeoutException)
    assert str(raised.value.request.url).endswith("/slow")


async def test_a_refused_connection_is_a_connect_error() -> None:
    """Nothing listening: httpx.ConnectError, which the retry policy repeats."""
    pool = _pool(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(httpx.ConnectError):
        await pool.exchange(WireRequest("GET", "/health"), LIMITS, None)
    await pool.aclose()


async def test_a_hang_up_before_the_answer_is_a_protocol_error() -> None:
    """A server that reads the request and closes: httpx.RemoteProtocolError (transient)."""

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.close()

    with serving(connection) as url:
        pool = _pool(url)
        with pytest.raises(httpx.RemoteProtocolError):
            await pool.exchange(WireRequest("GET", "/health"), LIMITS, None)
        await pool.aclose()


async def test_a_sink_gives_up_on_a_store_that_keeps_hanging_up() -> None:
    """Through the retry policy: every try hung up on is an APIConnectionError in the end."""
    tries: list[int] = []

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if await read_request(reader) is not None:
            tries.append(1)
        writer.close()

    with serving(connection) as url:
        async with HttpTokenSink(url=url, max_retries=1) as sink:
            with pytest.raises(APIConnectionError):
                await sink.begin_call("r1", "c1")
    assert len(tries) == 2


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (
            aiohttp.ClientConnectorError(
                aiohttp.client_reqrep.ConnectionKey("h", 1, False, True, None, None, None),
                OSError(111, "refused"),
            ),
            httpx.ConnectError,
        ),
        (aiohttp.ServerDisconnectedError(), httpx.RemoteProtocolError),
        (aiohttp.ClientPayloadError("cut"), httpx.RemoteProtocolError),
        (aiohttp.ClientOSError(104, "reset"), httpx.ReadError),
        (aiohttp.InvalidURL("nope"), httpx.UnsupportedProtocol),
        (aiohttp.ClientError("other"), httpx.TransportError),
    ],
    ids=["connect", "disconnected", "payload", "os-error", "invalid-url", "other"],
)
def test_aiohttp_errors_become_the_httpx_errors_of_the_same_meaning(
    raised: Exception, expected: type[httpx.TransportError]
) -> None:
    """The retry policy classifies aiohttp's failures as it does httpx's."""
    assert _error_type(raised) is expected


async def test_closing_twice_is_fine(canned: tuple[HostileServer, str]) -> None:
    """aclose is idempotent, before and after use."""
    _, url = canned
    pool = _pool(url)
    await pool.aclose()
    await pool.exchange(WireRequest("GET", "/health"), LIMITS, None)
    await pool.aclose()
    await pool.aclose()


async def test_the_environments_proxy_is_used_as_httpx_would(
    canned: tuple[HostileServer, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP_PROXY routes a store call through the proxy, as for httpx's pools."""
    proxy, proxy_url = canned
    monkeypatch.setenv("HTTP_PROXY", proxy_url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    pool = _pool("http://store.invalid:8100")
    await pool.exchange(WireRequest("GET", "/health"), LIMITS, None)
    await pool.aclose()
    assert proxy.requests == ["GET http://store.invalid:8100/health"]
