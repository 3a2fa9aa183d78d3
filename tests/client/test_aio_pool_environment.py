"""The aiohttp store connections read the environment for proxies only, never `.netrc`.

A real `~/.netrc` (HOME pointed at a temporary directory) with a `default`
entry, against a loopback server that records every request's headers: with
a token the calls work and carry the bearer token alone; without one no
password leaves the process (issue 29, item 2).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.loopback_http import read_request, serving
from token_finalizer_client import (
    APIConnectionError,
    HttpCaptureLedger,
    HttpLineageResolver,
    HttpTokenSink,
)

pytestmark = pytest.mark.anyio

# Every call's answer: what the sink, the ledger's has-rows read and a resolve accept.
_ANSWER = b'{"stored":true,"has_rows":false,"status":"unresolved","reason":"none"}'
_ITEMS = [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}]
_ENTRY = {
    "rollout_id": "r1",
    "model_call_id": "c1",
    "prompt_token_ids": [1],
    "generation_token_ids": [2],
    "generation_log_probs": [-0.5],
}


@pytest.fixture(autouse=True)
def netrc_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME holds a `.netrc` whose `default` entry matches every host."""
    netrc = tmp_path / ".netrc"
    netrc.write_text("default login u password p\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("NETRC", raising=False)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return netrc


@pytest.fixture
def recording() -> Iterator[tuple[list[dict[str, str]], str]]:
    """A store answering `_ANSWER` to every request, the headers it saw, and its URL."""
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


async def _use_every_connection(url: str, token: str | None) -> str:
    """A put, a has-rows read and a resolve; the resolve's reason."""
    async with HttpTokenSink(url=url, token=token, max_retries=0) as sink:
        await sink.put(_ENTRY)
    async with HttpCaptureLedger(url, token=token, max_retries=0) as ledger:
        assert await ledger.has_rows("r1") is False
    async with HttpLineageResolver(url=url, token=token, max_retries=0) as resolver:
        resolution = await resolver.resolve("r1", _ITEMS)
    return resolution.reason


async def test_with_a_token_the_netrc_entry_breaks_nothing(
    recording: tuple[list[dict[str, str]], str],
) -> None:
    """Sink, ledger and resolver all answer, each request carrying the bearer token only."""
    seen, url = recording
    assert await _use_every_connection(url, "t0k") == "none"  # not lookup_error
    assert len(seen) >= 3  # and the sink's /capabilities probe
    assert {headers["authorization"] for headers in seen} == {"Bearer t0k"}


async def test_without_a_token_no_netrc_password_is_sent(
    recording: tuple[list[dict[str, str]], str],
) -> None:
    """No request carries an Authorization header: the `.netrc` password stays home."""
    seen, url = recording
    await _use_every_connection(url, None)
    assert len(seen) >= 3  # and the sink's /capabilities probe
    assert all("authorization" not in headers for headers in seen)


async def test_a_request_aiohttp_refuses_is_a_connection_error_not_a_value_error(
    recording: tuple[list[dict[str, str]], str],
) -> None:
    """aiohttp's ValueError (a header it will not send) is an APIConnectionError."""
    _, url = recording
    async with HttpCaptureLedger(url, control_token="a\nb", max_retries=0) as ledger:
        with pytest.raises(APIConnectionError) as caught:
            await ledger.manifest("r1")
    assert not isinstance(caught.value, ValueError)
