"""One proxy behaviour for the whole package: httpx's pools and the aiohttp pool alike.

`environment_proxy` picks the proxy by httpx's rules; a tiny forwarding proxy
on loopback shows that both kinds of store connection (the httpx staging
classes, the aiohttp sink) send through `ALL_PROXY` (issue 29, item 12).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.support.loopback_http import read_request, serving
from token_finalizer_client import APIConnectionError, HttpStagingSource, HttpTokenSink
from token_finalizer_client._env_proxy import environment_proxy

_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")
_ANSWER = b'{"stored":true,"missing":[],"extras":[null]}'
_ENTRY = {
    "rollout_id": "r1",
    "model_call_id": "c1",
    "prompt_token_ids": [1],
    "generation_token_ids": [2],
    "generation_log_probs": [-0.5],
}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy variable of the machine running the tests counts."""
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.mark.parametrize(
    ("environment", "url", "expected"),
    [
        ({"ALL_PROXY": "http://p:1"}, "http://store:8100", "http://p:1"),
        ({"ALL_PROXY": "http://p:1"}, "https://store:8100", "http://p:1"),
        ({"ALL_PROXY": "http://p:1", "HTTP_PROXY": "http://h:2"}, "http://store", "http://h:2"),
        ({"HTTPS_PROXY": "http://s:3"}, "http://store", None),
        ({"HTTP_PROXY": "h:2"}, "http://store", "http://h:2"),
        ({"ALL_PROXY": "http://p:1", "NO_PROXY": "*"}, "http://store", None),
        ({"ALL_PROXY": "http://p:1", "NO_PROXY": "example.com"}, "http://a.example.com", None),
        ({"ALL_PROXY": "http://p:1", "NO_PROXY": "example.com"}, "http://example.com", None),
        (
            {"ALL_PROXY": "http://p:1", "NO_PROXY": "example.com"},
            "http://badexample.com",
            "http://p:1",
        ),
        (
            {"ALL_PROXY": "http://p:1", "NO_PROXY": ".example.com"},
            "http://example.com",
            "http://p:1",
        ),
        ({"ALL_PROXY": "http://p:1", "NO_PROXY": "127.0.0.1, ::1"}, "http://[::1]:8100", None),
    ],
    ids=[
        "all-http",
        "all-https",
        "scheme-first",
        "other-scheme",
        "no-scheme",
        "no-proxy-star",
        "subdomain",
        "domain",
        "not-a-suffix",
        "dot-only-subdomains",
        "ipv6",
    ],
)
def test_the_proxy_is_chosen_as_httpx_chooses_it(
    environment: dict[str, str], url: str, expected: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheme's variable, else ALL_PROXY, unless NO_PROXY names the host."""
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert environment_proxy(url) == expected


@pytest.fixture
def store() -> Iterator[str]:
    """A store on loopback answering `_ANSWER` to every request."""

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (request := await read_request(reader)) is not None:
            head = f"HTTP/1.1 200 OK\r\ncontent-length: {len(_ANSWER)}\r\n"
            writer.write(f"{head}content-type: application/json\r\n\r\n".encode() + _ANSWER)
            await writer.drain()
            if request[2].get("connection") == "close":  # the proxy reads up to the end
                break
        writer.close()

    with serving(connection) as url:
        yield url


@pytest.fixture
def proxy() -> Iterator[tuple[list[str], str]]:
    """A forwarding HTTP proxy to loopback hosts only; the targets it was asked for."""
    targets: list[str] = []

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (request := await read_request(reader)) is not None:
            method, target, headers, body = request
            targets.append(f"{method} {target}")
            parts = urlsplit(target)
            if parts.hostname != "127.0.0.1" or parts.port is None:
                writer.write(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n")
                continue
            upstream_reader, upstream = await asyncio.open_connection("127.0.0.1", parts.port)
            headers = {k: v for k, v in headers.items() if not k.startswith("proxy-")}
            headers["connection"] = "close"
            lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
            upstream.write(f"{method} {parts.path} HTTP/1.1\r\n{lines}\r\n".encode() + body)
            await upstream.drain()
            answer = await upstream_reader.read()
            upstream.close()
            writer.write(answer)
            await writer.drain()
        writer.close()

    with serving(connection) as url:
        yield targets, url


@pytest.mark.anyio
async def test_the_aiohttp_sink_sends_through_all_proxy(
    store: str, proxy: tuple[list[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ALL_PROXY alone set, a put reaches the store through the proxy."""
    targets, proxy_url = proxy
    monkeypatch.setenv("ALL_PROXY", proxy_url)
    async with HttpTokenSink(url=store, max_retries=0) as sink:
        await sink.put(_ENTRY)
    assert targets == [f"PUT {store}/ng-rollout/r1/training-token-capture/calls/c1"]


def test_the_httpx_staging_source_sends_through_all_proxy(
    store: str, proxy: tuple[list[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same ALL_PROXY carries the staging classes' requests (httpx's pools)."""
    targets, proxy_url = proxy
    monkeypatch.setenv("ALL_PROXY", proxy_url)
    with HttpStagingSource(store, max_retries=0) as source:
        assert source.fetch_extras("r1/c1") is None
    assert targets == [f"POST {store}/ng-rollout/r1/training-token-capture/staged/extras"]


@pytest.mark.anyio
async def test_no_proxy_sends_the_aiohttp_sink_directly(
    store: str, proxy: tuple[list[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """NO_PROXY naming the store's host skips ALL_PROXY."""
    targets, proxy_url = proxy
    monkeypatch.setenv("ALL_PROXY", proxy_url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    async with HttpTokenSink(url=store, max_retries=0) as sink:
        await sink.put(_ENTRY)
    assert targets == []


@pytest.mark.anyio
async def test_a_socks_proxy_is_refused_by_the_aiohttp_sink(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiohttp speaks no SOCKS: an APIConnectionError naming the proxy, its password masked."""
    monkeypatch.setenv("ALL_PROXY", "socks5://u:PW@127.0.0.1:1080")
    async with HttpTokenSink(url=store, max_retries=0) as sink:
        with pytest.raises(APIConnectionError, match="not an http") as caught:
            await sink.put(_ENTRY)
    assert "PW" not in str(caught.value) and "***@127.0.0.1" in str(caught.value)
