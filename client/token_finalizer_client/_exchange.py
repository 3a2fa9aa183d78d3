"""One try of one request: sent, and its answer read whole within a deadline and a size limit.

Every client of the package reads answers here (docs/architecture.md#bounded-answers):

- the try's whole exchange (connect, send, the head, every byte of the body)
  ends by its deadline: `asyncio.timeout` around an async try, a deadline on
  every socket operation of a blocking one (`_deadline`), checked again
  between the body's chunks; past it the try fails with `ExchangeTimeout`
  (an httpx timeout, so the retry policy repeats it like any other);
- the raw body is read up to the limit and decoded here, within the same
  limit (`_decoding`), never by httpx's unbounded decoders;
- an error answer is read up to `MAX_ERROR_BODY_BYTES` only: its message is
  all it carries.

The answer is a `Reply`: status, headers and the decoded body, already
released from the connection.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

import httpx

from token_finalizer_client._constants import MAX_ERROR_BODY_BYTES
from token_finalizer_client._deadline import deadline_scope, past_deadline
from token_finalizer_client._decoding import decode_content
from token_finalizer_client._exceptions import AnswerTooLargeError, InvalidAnswerError
from token_finalizer_client._reply import Reply
from token_finalizer_client._wire import WireRequest

__all__ = [
    "AnswerBody",
    "AnswerLimits",
    "AsyncPool",
    "ExchangeTimeout",
    "HttpxAsyncPool",
    "Reply",
    "aexchange",
    "describe_request",
    "exchange",
    "timed_out",
    "try_deadline",
]


class ExchangeTimeout(httpx.TimeoutException):
    """A try (or the whole call) ran past its deadline; retried like any timeout."""


@dataclass(frozen=True, slots=True)
class AnswerLimits:
    """How long one try may take (seconds; None: httpx's own timeouts only) and how large
    a successful answer may be once decoded."""

    timeout_s: float | None
    max_bytes: int


def describe_request(request: httpx.Request) -> str:
    """`METHOD scheme://host:port/path` of a request: never its credentials or headers."""
    url = request.url
    # The netloc never carries the URL's credentials; the path carries ids, not secrets.
    return f"{request.method} {url.scheme}://{url.netloc.decode('ascii')}{url.path}"


def try_deadline(limits: AnswerLimits, call_deadline: float | None) -> float | None:
    """When this try must be over: its own timeout, cut to the call's deadline."""
    own = None if limits.timeout_s is None else time.monotonic() + limits.timeout_s
    if own is None or call_deadline is None:
        return own if call_deadline is None else call_deadline
    return min(own, call_deadline)


def timed_out(request: httpx.Request, limits: AnswerLimits) -> ExchangeTimeout:
    """The error of a try that ran past its deadline."""
    return ExchangeTimeout(
        f"no whole answer within the try's timeout ({limits.timeout_s}s) or the call's deadline",
        request=request,
    )


class AnswerBody:
    """The raw body of one answer as it arrives, held to its size limit.

    `name` is the call as messages name it (`describe_request`); `decoded`
    says the body arrives already decoded (an answer made in memory).
    """

    def __init__(self, success: bool, limits: AnswerLimits, name: str, decoded: bool) -> None:
        self.success = success
        self.limit = limits.max_bytes if success else MAX_ERROR_BODY_BYTES
        self.name = name
        self.decoded = decoded
        self.parts: list[bytes] = []
        self.size = 0
        self.cut = False  # an error body longer than its limit: the rest was not read

    def add(self, chunk: bytes) -> bool:
        """Keep `chunk`; False once an error body is long enough (stop reading)."""
        self.size += len(chunk)
        if self.size > self.limit:
            if self.success:
                raise AnswerTooLargeError(f"{self.name} answered more than {self.limit} bytes")
            self.cut = True
            return False
        self.parts.append(chunk)
        return True

    def reply(self, status_code: int, headers: Mapping[str, str]) -> Reply:
        """The answer with its body decoded (an error body: as far as it can be)."""
        raw = b"".join(self.parts)
        encoding = "" if self.decoded else headers.get("content-encoding", "")
        if self.success:
            try:
                content = decode_content(raw, encoding, self.limit)
            except InvalidAnswerError as exc:
                raise type(exc)(f"{self.name} answered unreadably: {exc}") from None
        elif self.cut:
            # Only an unencoded start is worth reading as the server's message.
            plain = encoding.strip().lower() in ("", "identity")
            content = raw if plain else b""
        else:
            try:
                content = decode_content(raw, encoding, self.limit)
            except InvalidAnswerError:
                content = b""
        return Reply(status_code, headers, content, self.name)


def _body_of(response: httpx.Response, request: httpx.Request, limits: AnswerLimits) -> AnswerBody:
    # An answer made in memory (a mock transport) arrives read and decoded by httpx.
    decoded = response.is_stream_consumed
    return AnswerBody(response.is_success, limits, describe_request(request), decoded)


def _raw_chunks(response: httpx.Response, body: AnswerBody) -> Iterator[bytes]:
    """The answer's body as it arrives, still encoded (or whole, when made in memory)."""
    return iter((response.content,)) if body.decoded else response.iter_raw()


def exchange(
    http: httpx.Client,
    request: WireRequest,
    limits: AnswerLimits,
    call_deadline: float | None = None,
) -> Reply:
    """Send `request` once on a blocking pool and read its answer whole (see the module)."""
    built = http.build_request(**request.send_options())
    deadline = try_deadline(limits, call_deadline)
    if past_deadline(deadline):
        raise timed_out(built, limits)
    with deadline_scope(deadline):
        response = http.send(built, stream=True)
        try:
            body = _body_of(response, built, limits)
            for chunk in _raw_chunks(response, body):
                if not body.add(chunk):
                    break
                if past_deadline(deadline):
                    raise timed_out(built, limits)
        finally:
            response.close()
    return body.reply(response.status_code, response.headers)


async def _aread(http: httpx.AsyncClient, built: httpx.Request, limits: AnswerLimits) -> Reply:
    response = await http.send(built, stream=True)
    try:
        body = _body_of(response, built, limits)
        if body.decoded:
            body.add(response.content)
        else:
            async for chunk in response.aiter_raw():
                if not body.add(chunk):
                    break
    finally:
        await response.aclose()
    return body.reply(response.status_code, response.headers)


async def aexchange(
    http: httpx.AsyncClient,
    request: WireRequest,
    limits: AnswerLimits,
    call_deadline: float | None = None,
) -> Reply:
    """`exchange` on an asyncio pool: the try runs inside `asyncio.timeout`."""
    built = http.build_request(**request.send_options())
    deadline = try_deadline(limits, call_deadline)
    if deadline is None:
        return await _aread(http, built, limits)
    left = deadline - time.monotonic()
    if left <= 0:
        raise timed_out(built, limits)
    try:
        async with asyncio.timeout(left):
            return await _aread(http, built, limits)
    except TimeoutError:
        raise timed_out(built, limits) from None


class AsyncPool(Protocol):
    """An asyncio connection pool as the retry policy drives it: one try per `exchange`.

    Two kinds exist (docs/architecture.md#round-trips): `HttpxAsyncPool`, any
    httpx transport (the finalizer client; a store connection given a
    transport), and `AioPool` (`_aio_pool`), a store connection's own pool
    on the network.
    """

    async def exchange(
        self, request: WireRequest, limits: AnswerLimits, call_deadline: float | None
    ) -> Reply:
        """Send `request` once and read its answer whole (see the module)."""
        ...

    async def aclose(self) -> None:
        """Close every connection of the pool."""
        ...

    def forget(self) -> None:
        """Let go of a pool whose event loop has closed, awaiting nothing (`_loop_pools`)."""
        ...


class HttpxAsyncPool:
    """An `httpx.AsyncClient` as an `AsyncPool`."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def exchange(
        self, request: WireRequest, limits: AnswerLimits, call_deadline: float | None
    ) -> Reply:
        """`aexchange` on the wrapped client."""
        return await aexchange(self.client, request, limits, call_deadline)

    async def aclose(self) -> None:
        """Close the wrapped client."""
        await self.client.aclose()

    def forget(self) -> None:
        """Nothing to do: httpx warns of no unclosed client, its sockets die with their loop."""
