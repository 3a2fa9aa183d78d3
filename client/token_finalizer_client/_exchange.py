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
from collections.abc import Iterator
from dataclasses import dataclass

import httpx

from token_finalizer_client._constants import MAX_ERROR_BODY_BYTES
from token_finalizer_client._deadline import deadline_scope, past_deadline
from token_finalizer_client._decoding import decode_content
from token_finalizer_client._exceptions import AnswerTooLargeError, InvalidAnswerError
from token_finalizer_client._wire import WireRequest

__all__ = [
    "AnswerLimits",
    "ExchangeTimeout",
    "Reply",
    "aexchange",
    "describe_request",
    "exchange",
]


class ExchangeTimeout(httpx.TimeoutException):
    """A try (or the whole call) ran past its deadline; retried like any timeout."""


@dataclass(frozen=True, slots=True)
class AnswerLimits:
    """How long one try may take (seconds; None: httpx's own timeouts only) and how large
    a successful answer may be once decoded."""

    timeout_s: float | None
    max_bytes: int


@dataclass(frozen=True, slots=True)
class Reply:
    """One HTTP answer, read whole: its status, headers and decoded body.

    `content` of an error answer is empty when its body was too large or did
    not decode (its status still says what happened). `request` names the
    call in messages: method and URL, never headers.
    """

    status_code: int
    headers: httpx.Headers
    content: bytes
    request: str

    @property
    def is_success(self) -> bool:
        """Whether the status is 2xx."""
        return 200 <= self.status_code < 300

    @property
    def text(self) -> str:
        """The body as text (UTF-8; undecodable bytes replaced)."""
        return self.content.decode("utf-8", "replace")


def describe_request(request: httpx.Request) -> str:
    """`METHOD scheme://host:port/path` of a request: never its credentials or headers."""
    url = request.url
    # The netloc never carries the URL's credentials; the path carries ids, not secrets.
    return f"{request.method} {url.scheme}://{url.netloc.decode('ascii')}{url.path}"


def _try_deadline(limits: AnswerLimits, call_deadline: float | None) -> float | None:
    """When this try must be over: its own timeout, cut to the call's deadline."""
    own = None if limits.timeout_s is None else time.monotonic() + limits.timeout_s
    if own is None or call_deadline is None:
        return own if call_deadline is None else call_deadline
    return min(own, call_deadline)


def _timed_out(request: httpx.Request, limits: AnswerLimits) -> ExchangeTimeout:
    return ExchangeTimeout(
        f"no whole answer within the try's timeout ({limits.timeout_s}s) or the call's deadline",
        request=request,
    )


class _Body:
    """The raw body of one answer as it arrives, held to its size limit."""

    def __init__(self, response: httpx.Response, limits: AnswerLimits) -> None:
        self.success = response.is_success
        self.limit = limits.max_bytes if self.success else MAX_ERROR_BODY_BYTES
        self.parts: list[bytes] = []
        self.size = 0
        self.cut = False  # an error body longer than its limit: the rest was not read
        # An answer made in memory (a mock transport) arrives read and decoded by httpx.
        self.decoded = response.is_stream_consumed

    def add(self, chunk: bytes, request: httpx.Request) -> bool:
        """Keep `chunk`; False once an error body is long enough (stop reading)."""
        self.size += len(chunk)
        if self.size > self.limit:
            if self.success:
                raise AnswerTooLargeError(
                    f"{describe_request(request)} answered more than {self.limit} bytes"
                )
            self.cut = True
            return False
        self.parts.append(chunk)
        return True

    def reply(self, response: httpx.Response, request: httpx.Request) -> Reply:
        """The answer with its body decoded (an error body: as far as it can be)."""
        raw = b"".join(self.parts)
        encoding = "" if self.decoded else response.headers.get("content-encoding", "")
        if self.success:
            try:
                content = decode_content(raw, encoding, self.limit)
            except InvalidAnswerError as exc:
                raise type(exc)(f"{describe_request(request)} answered unreadably: {exc}") from None
        elif self.cut:
            # Only an unencoded start is worth reading as the server's message.
            plain = encoding.strip().lower() in ("", "identity")
            content = raw if plain else b""
        else:
            try:
                content = decode_content(raw, encoding, self.limit)
            except InvalidAnswerError:
                content = b""
        return Reply(response.status_code, response.headers, content, describe_request(request))


def _raw_chunks(response: httpx.Response, body: _Body) -> Iterator[bytes]:
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
    deadline = _try_deadline(limits, call_deadline)
    if past_deadline(deadline):
        raise _timed_out(built, limits)
    with deadline_scope(deadline):
        response = http.send(built, stream=True)
        try:
            body = _Body(response, limits)
            for chunk in _raw_chunks(response, body):
                if not body.add(chunk, built):
                    break
                if past_deadline(deadline):
                    raise _timed_out(built, limits)
        finally:
            response.close()
    return body.reply(response, built)


async def _aread(
    http: httpx.AsyncClient, built: httpx.Request, limits: AnswerLimits
) -> tuple[httpx.Response, _Body]:
    response = await http.send(built, stream=True)
    try:
        body = _Body(response, limits)
        if body.decoded:
            body.add(response.content, built)
        else:
            async for chunk in response.aiter_raw():
                if not body.add(chunk, built):
                    break
    finally:
        await response.aclose()
    return response, body


async def aexchange(
    http: httpx.AsyncClient,
    request: WireRequest,
    limits: AnswerLimits,
    call_deadline: float | None = None,
) -> Reply:
    """`exchange` on an asyncio pool: the try runs inside `asyncio.timeout`."""
    built = http.build_request(**request.send_options())
    deadline = _try_deadline(limits, call_deadline)
    if deadline is None:
        response, body = await _aread(http, built, limits)
        return body.reply(response, built)
    left = deadline - time.monotonic()
    if left <= 0:
        raise _timed_out(built, limits)
    try:
        async with asyncio.timeout(left):
            response, body = await _aread(http, built, limits)
    except TimeoutError:
        raise _timed_out(built, limits) from None
    return body.reply(response, built)
