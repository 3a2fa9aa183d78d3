"""Bounded clients: a hostile server on loopback can neither flood nor hold a client of the package.

Every client (the lineage resolver, the writer sink, the sync and async
finalizer clients) meets a real server that answers a zstd or gzip bomb, an
enormous error message, or trickles its answer a few bytes a second, head or
body. None of it may take the caller down: the resolver answers
`lookup_error`, the others raise a `FinalizerError` subclass, each after at
most its tries (the tries are counted, never timed).
"""

from __future__ import annotations

import contextlib
import logging
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import zstandard

from tests.client.conftest import Connect
from tests.client.hostile_server import Canned, HostileServer
from tests.support.captures import make_entry
from token_finalizer_client import (
    AnswerTooLargeError,
    APITimeoutError,
    ConflictError,
    HttpLineageResolver,
    HttpTokenSink,
    ServerError,
)
from token_finalizer_client._constants import (
    DEFAULT_MAX_ANSWER_BYTES,
    DEFAULT_STORE_MAX_ANSWER_BYTES,
    LOGGER_NAME,
    MAX_MESSAGE_CHARS,
)

pytestmark = pytest.mark.anyio

MIB = 1024 * 1024
ITEMS = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "It is sunny."},
    {"role": "user", "content": "And tomorrow?"},
]
MATCH = {"model_call_id": "c1", "cumulative_token_ids": [1, 2], "digest": "d", "prev_len": 2}
RESOLVED = orjson.dumps({"status": "resolved", "reason": "", "match": MATCH})
JSON = {"content-type": "application/json"}


def zstd_bomb(head: bytes, filler_bytes: int, tail: bytes) -> bytes:
    """`head`, then `filler_bytes` of "A", then `tail`, as one zstd frame announcing no size."""
    compressor = zstandard.ZstdCompressor(level=1).compressobj()
    filler = b"A" * MIB
    parts = [compressor.compress(head)]
    parts += [compressor.compress(filler) for _ in range(filler_bytes // MIB)]
    return b"".join([*parts, compressor.compress(tail), compressor.flush()])


def gzip_bomb(head: bytes, filler_bytes: int, tail: bytes) -> bytes:
    """The same as one valid gzip member, built from one compressed MiB repeated (fast to make)."""
    filler = b"A" * MIB
    count = filler_bytes // MIB
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    first = compressor.compress(head) + compressor.flush(zlib.Z_FULL_FLUSH)
    # After a full flush the compressor starts afresh: every MiB of filler is these bytes.
    again = compressor.compress(filler) + compressor.flush(zlib.Z_FULL_FLUSH)
    end = (compressor.compress(tail) + compressor.flush())[:-8]  # the trailer is redone below
    crc = zlib.crc32(head)
    for _ in range(count):
        crc = zlib.crc32(filler, crc)
    crc = zlib.crc32(tail, crc)
    size = len(head) + count * MIB + len(tail)
    return first + again * count + end + struct.pack("<II", crc, size & 0xFFFFFFFF)


def json_bomb(encoding: str, head: bytes, filler_bytes: int, tail: bytes) -> Canned:
    """A 200 whose compressed body is valid JSON padded with `filler_bytes` of text."""
    make = zstd_bomb if encoding == "zstd" else gzip_bomb
    return Canned(200, make(head, filler_bytes, tail), {**JSON, "content-encoding": encoding})


@pytest.fixture(scope="module", params=["zstd", "gzip"])
def store_bomb(request: pytest.FixtureRequest) -> Canned:
    """A store answer that would be a valid one (an unresolved resolution, a stored put) once
    decoded, but decodes to twice what a store answer may be."""
    head = b'{"status": "unresolved", "stored": true, "reason": "'
    return json_bomb(request.param, head, 2 * DEFAULT_STORE_MAX_ANSWER_BYTES, b'"}')


@contextlib.contextmanager
def serving(*answers: Canned) -> Iterator[tuple[HostileServer, str]]:
    """A hostile server giving `answers` while the block runs: (the server, its base URL)."""
    server = HostileServer(*answers)
    with server.running() as url:
        yield server, url


@pytest.fixture
def hostile(request: pytest.FixtureRequest) -> Iterator[tuple[HostileServer, str]]:
    """A hostile server answering the test's parameter (a Canned answer) to every request."""
    with serving(request.param) as running:
        yield running


TRICKLES = [
    Canned(200, RESOLVED, JSON, drip_body=True),
    Canned(200, RESOLVED, JSON, drip_head=True),
]


async def resolve(url: str, **options: Any) -> Any:
    async with HttpLineageResolver(url=url, **options) as resolver:
        return await resolver.resolve("r1", ITEMS)


# -- the lineage resolver ----------------------------------------------------------------------


def resolves(server: HostileServer) -> list[str]:
    """The resolve requests a server saw (the resolver also asks /capabilities first)."""
    return [request for request in server.requests if request.endswith("/lineage/resolve")]


async def test_resolver_refuses_a_bomb(store_bomb: Canned) -> None:
    """A compressed answer decoding past the store limit is a lookup_error, asked once."""
    with serving(store_bomb) as (server, url):
        resolution = await resolve(url)
        assert (resolution.status, resolution.reason) == ("unresolved", "lookup_error")
        assert len(resolves(server)) == 1


@pytest.mark.parametrize("hostile", TRICKLES, ids=["body", "head"], indirect=True)
async def test_resolver_is_not_held_by_a_trickle(hostile: tuple[HostileServer, str]) -> None:
    """A store trickling its answer costs two bounded tries, then a lookup_error."""
    server, url = hostile
    resolution = await resolve(url, timeout=0.5, max_retries=1)
    assert (resolution.status, resolution.reason) == ("unresolved", "lookup_error")
    assert len(resolves(server)) == 2


async def test_resolver_reads_a_well_behaved_answer() -> None:
    """The same server answering at once resolves (the trickle alone made the difference)."""
    with serving(Canned(200, RESOLVED, JSON)) as (_, url):
        resolution = await resolve(url, timeout=0.5, max_retries=1)
        assert resolution.match is not None and resolution.match.cumulative_token_ids == (1, 2)


# -- the writer sink ---------------------------------------------------------------------------


async def put(url: str, **options: Any) -> None:
    async with HttpTokenSink(url=url, **options) as sink:
        await sink.put(make_entry("r1", "c1", [1, 2], [3]))


async def test_sink_refuses_a_bomb(store_bomb: Canned) -> None:
    """A put answered by a bomb raises AnswerTooLargeError, and is not repeated."""
    with serving(store_bomb) as (server, url):
        with pytest.raises(AnswerTooLargeError):
            await put(url)
        assert len(server.requests) == 1


@pytest.mark.parametrize("hostile", TRICKLES, ids=["body", "head"], indirect=True)
async def test_sink_is_not_held_by_a_trickle(
    hostile: tuple[HostileServer, str], caplog: pytest.LogCaptureFixture
) -> None:
    """A put to a trickling store raises APITimeoutError after two bounded tries."""
    server, url = hostile
    with caplog.at_level(logging.WARNING, logger=LOGGER_NAME), pytest.raises(APITimeoutError):
        await put(url, timeout=0.5, max_retries=1)
    # The tries are counted where they are made: on a loaded machine the server's thread may
    # not have read the second request before that try's half second ran out.
    retries = [record for record in caplog.records if record.name == LOGGER_NAME]
    assert len(retries) == 1
    assert 1 <= len(server.requests) <= 2


async def test_sink_shortens_an_enormous_error_message() -> None:
    """A 409 whose message is ten million characters raises with a short message."""
    body = orjson.dumps({"error": "x" * 10_000_000})
    with serving(Canned(409, body, JSON)) as (_, url), pytest.raises(ConflictError) as raised:
        await put(url)
    assert len(raised.value.message) <= MAX_MESSAGE_CHARS + 40


# -- the finalizer clients (sync and async) ----------------------------------------------------


def test_client_refuses_a_bomb(connect: Connect) -> None:
    """A finalizer answering a zstd bomb past the client's limit raises AnswerTooLargeError."""
    answer = json_bomb("zstd", b'{"status": "ok", "pad": "', DEFAULT_MAX_ANSWER_BYTES, b'"}')
    with serving(answer) as (server, url):
        with pytest.raises(AnswerTooLargeError):
            connect(url).health()
        assert len(server.requests) == 1


@pytest.mark.parametrize("hostile", TRICKLES, ids=["body", "head"], indirect=True)
def test_client_is_not_held_by_a_trickle(
    connect: Connect, hostile: tuple[HostileServer, str]
) -> None:
    """A finalizer trickling its answer raises APITimeoutError after two bounded tries."""
    server, url = hostile
    with pytest.raises(APITimeoutError):
        connect(url, timeout=0.5, max_retries=1).health()
    assert len(server.requests) == 2


def test_client_shortens_an_enormous_error_message(connect: Connect) -> None:
    """A 500 whose plain-text body is ten million characters raises with a short message."""
    with serving(Canned(500, b"y" * 10_000_000)) as (_, url), pytest.raises(ServerError) as raised:
        connect(url).health()
    assert len(str(raised.value)) <= MAX_MESSAGE_CHARS + 60
