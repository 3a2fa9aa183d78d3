"""The shared HTTP side (`token_finalizer_client.transport`): how a capture-store pool is opened."""

from __future__ import annotations

import httpx
import pytest

from token_finalizer_client import transport
from token_finalizer_client.transport import StoreConnection, StoreEndpoint

pytestmark = pytest.mark.anyio


def test_endpoint_drops_the_trailing_slash() -> None:
    """The base URL is kept without its trailing slash, its path included."""
    assert StoreEndpoint.create("http://store.test/base/").url == "http://store.test/base"


@pytest.mark.parametrize("url", ["store.test:8100", "ftp://store.test", ""])
def test_endpoint_refuses_a_url_that_is_not_http(url: str) -> None:
    """Only http:// and https:// URLs name a store."""
    with pytest.raises(ValueError, match="must start with http:// or https://"):
        StoreEndpoint.create(url)


@pytest.mark.parametrize("timeout_s", [0.0, -1.0, float("nan")])
def test_endpoint_refuses_a_timeout_that_is_not_positive(timeout_s: float) -> None:
    """A timeout must be a positive number of seconds."""
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        StoreEndpoint.create("http://store.test", timeout_s=timeout_s)


def test_endpoint_refuses_an_empty_token() -> None:
    """An empty token is a configuration mistake, not "no token"."""
    with pytest.raises(ValueError, match="token is empty"):
        StoreEndpoint.create("http://store.test", token="")


# uvicorn's default `timeout_keep_alive`: the store server closes a connection idle this long.
_SERVER_IDLE_TIMEOUT_S = 5.0


def test_pool_drops_idle_connections_before_the_server_does() -> None:
    """A pooled store connection expires before a uvicorn server's idle timeout closes it."""
    expiry = StoreEndpoint.create("http://store.test").limits.keepalive_expiry
    assert expiry is not None and 0 < expiry < _SERVER_IDLE_TIMEOUT_S


def test_connect_gets_at_most_five_seconds_of_the_timeout() -> None:
    """Reads get the whole timeout (a large snapshot); a connect at most 5 s (the store is gone)."""
    long = StoreEndpoint.create("http://store.test", timeout_s=30.0).timeout
    short = StoreEndpoint.create("http://store.test", timeout_s=2.0).timeout
    assert (long.read, long.connect, short.read, short.connect) == (30.0, 5.0, 2.0, 2.0)


def test_pool_limits_are_the_callers() -> None:
    """Each caller sizes its own pool."""
    limits = StoreEndpoint.create("http://s.test", max_connections=7, max_keepalive=3).limits
    assert (limits.max_connections, limits.max_keepalive_connections) == (7, 3)


def test_repr_never_shows_the_token() -> None:
    """An endpoint printed in a log names the URL, not the bearer token."""
    endpoint = StoreEndpoint.create("http://store.test", token="s3cret")
    assert "s3cret" not in repr(endpoint) and "http://store.test" in repr(endpoint)


async def test_an_opened_pool_sends_the_endpoints_headers() -> None:
    """Requests of the opened pool carry the bearer token, JSON and the asked-for encoding."""
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={})

    endpoint = StoreEndpoint.create("http://store.test/s", token="t0k", accept_encoding="zstd")
    async with endpoint.open(httpx.MockTransport(answer)) as pool:
        await pool.get("/health")
    headers = seen[0].headers
    assert (str(seen[0].url), headers["authorization"], headers["accept"]) == (
        "http://store.test/s/health",
        "Bearer t0k",
        "application/json",
    )
    assert headers["accept-encoding"] == "zstd"


def test_every_public_name_is_in_all() -> None:
    """The module's `__all__` lists exactly its public names."""
    public = {name for name in vars(transport) if not name.startswith("_")} - {"annotations"}
    assert public == set(transport.__all__)


def test_store_connections_are_sized_for_a_model_servers_concurrency() -> None:
    """A sink or resolver keeps up to 256 connections, all of them alive between calls."""
    limits = StoreConnection(url="http://store.test")._endpoint.limits
    assert (limits.max_connections, limits.max_keepalive_connections) == (256, 256)


def test_store_connection_pool_size_is_a_keyword() -> None:
    """A model server with other needs sizes the pool from its kwargs."""
    connection = StoreConnection(url="http://s.test", max_connections=8, max_keepalive=4)
    limits = connection._endpoint.limits
    assert (limits.max_connections, limits.max_keepalive_connections) == (8, 4)


@pytest.mark.parametrize(("connections", "keepalive"), [(0, 0), (4, 8), (4, -1)])
def test_store_connection_refuses_a_pool_that_cannot_work(connections: int, keepalive: int) -> None:
    """No connections at all, or more kept alive than allowed, fails at construction."""
    with pytest.raises(ValueError, match="max_connections"):
        StoreConnection(url="http://s.test", max_connections=connections, max_keepalive=keepalive)
