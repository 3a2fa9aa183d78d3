"""User info in a URL is sent as Basic auth and never shown (issue 29, item 13).

Reprs, the bad-scheme ValueError and the resolver's warning line show `***`
for it; a loopback server records which Authorization header each kind of
connection sends: Basic from the URL, or the bearer token when one is given.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Iterator

import pytest

from tests.support.loopback_http import read_request, serving
from tests.support.servers import free_port
from token_finalizer_client import (
    FinalizerClient,
    HttpCaptureLedger,
    HttpLineageResolver,
    HttpStagingSource,
    HttpTokenSink,
)
from token_finalizer_client._url_credentials import masked, without_user_info

_BASIC = "Basic " + base64.b64encode(b"svc:P@ss word").decode()
_ANSWER = b'{"status":"ok","stored":true,"missing":[],"extras":[null]}'
_ITEMS = [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}]


def _with_user_info(url: str) -> str:
    return url.replace("http://", "http://svc:P%40ss%20word@")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://svc:PW@store:8100/x", "http://***@store:8100/x"),
        ("http://svc:P@W@store", "http://***@store"),
        ("at http://a:b@h and https://c@d/", "at http://***@h and https://***@d/"),
        ("http://store:8100/a@b", "http://store:8100/a@b"),
    ],
    ids=["password", "at-in-password", "two-urls", "at-in-path"],
)
def test_user_info_is_masked_wherever_it_stands(text: str, expected: str) -> None:
    """Everything between `scheme://` and the host's `@` becomes `***`."""
    assert masked(text) == expected


def test_user_info_is_taken_out_of_the_url_percent_decoded() -> None:
    """The bare URL, and the Basic value of the decoded user and password."""
    assert without_user_info("http://svc:P%40ss%20word@store:8100/p") == (
        "http://store:8100/p",
        _BASIC,
    )


@pytest.mark.parametrize("cls", [HttpTokenSink, HttpLineageResolver, HttpCaptureLedger])
def test_a_store_connections_repr_masks_the_password(cls: type[HttpTokenSink]) -> None:
    """repr names the store with `***` for its user info."""
    shown = repr(cls(url="http://svc:PW@store:8100"))
    assert "PW" not in shown and "http://***@store:8100" in shown


def test_the_staging_sources_repr_masks_the_password() -> None:
    """The blocking (httpx) store connections mask it too."""
    shown = repr(HttpStagingSource("http://svc:PW@store:8100"))
    assert "PW" not in shown and "***@store" in shown


def test_the_bad_scheme_error_of_a_store_connection_masks_the_password() -> None:
    """ValueError for `ftp://svc:PW@...` names the URL without the password."""
    with pytest.raises(ValueError, match="must start with") as caught:
        HttpTokenSink(url="ftp://svc:PW@store:8100")
    assert "PW" not in str(caught.value)


def test_the_bad_scheme_error_of_the_finalizer_client_masks_the_password() -> None:
    """FinalizerClient's ValueError for a bad scheme, and its base_url, show no password."""
    with pytest.raises(ValueError, match="must start with") as caught:
        FinalizerClient("ftp://svc:PW@finalizer:8000")
    assert "PW" not in str(caught.value)
    with FinalizerClient("http://svc:PW@finalizer:8000") as client:
        assert client.base_url == "http://***@finalizer:8000"


@pytest.mark.anyio
async def test_the_resolvers_warning_line_masks_the_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failed lookup's warning names the store with `***`."""
    url = f"http://svc:PW@127.0.0.1:{free_port()}"
    with caplog.at_level(logging.WARNING, logger="token_finalizer_client"):
        async with HttpLineageResolver(url=url, max_retries=0) as resolver:
            assert (await resolver.resolve("r1", _ITEMS)).reason == "lookup_error"
    lines = [record.getMessage() for record in caplog.records]
    assert lines and all("PW" not in line for line in lines)
    assert "***@127.0.0.1" in lines[0]


@pytest.fixture
def recording() -> Iterator[tuple[list[dict[str, str]], str]]:
    """A server answering `_ANSWER` to every request, the headers it saw, and its URL."""
    seen: list[dict[str, str]] = []

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (request := await read_request(reader)) is not None:
            seen.append(request[2])
            head = f"HTTP/1.1 200 OK\r\ncontent-length: {len(_ANSWER)}\r\n"
            writer.write(f"{head}content-type: application/json\r\n\r\n".encode() + _ANSWER)
            await writer.drain()
        writer.close()

    with serving(connection) as url:
        yield seen, url


@pytest.mark.anyio
@pytest.mark.parametrize(("token", "expected"), [(None, _BASIC), ("t0k", "Bearer t0k")])
async def test_the_aiohttp_connections_send_user_info_as_basic_auth_unless_a_token(
    recording: tuple[list[dict[str, str]], str], token: str | None, expected: str
) -> None:
    """The sink sends the URL's user info as Basic auth; a bearer token wins over it."""
    seen, url = recording
    async with HttpTokenSink(url=_with_user_info(url), token=token, max_retries=0) as sink:
        await sink.begin_call("r1", "c1")
    assert [headers.get("authorization") for headers in seen] == [expected]


@pytest.mark.parametrize(("token", "expected"), [(None, _BASIC), ("t0k", "Bearer t0k")])
def test_the_httpx_connections_send_user_info_as_basic_auth_unless_a_token(
    recording: tuple[list[dict[str, str]], str], token: str | None, expected: str
) -> None:
    """The staging source and FinalizerClient do the same over httpx."""
    seen, url = recording
    with HttpStagingSource(_with_user_info(url), token=token, max_retries=0) as source:
        source.fetch_extras("r1/c1")
    with FinalizerClient(_with_user_info(url), token=token, max_retries=0) as client:
        client.health()
    assert [headers.get("authorization") for headers in seen] == [expected, expected]
