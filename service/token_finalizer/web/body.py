"""The one reader of JSON-object request bodies, for the finalizer API and the store server.

A body over the limit is refused from its Content-Length before a byte of it
is read, and a chunked body (no length announced) is cut off as soon as it
grows past the limit, so a runaway client cannot make a server buffer it. A
body that does not arrive in time (REQUEST_BODY_TIMEOUT_S, plus one second
per REQUEST_BODY_MIN_BYTES_PER_S received) is answered 408, so a client
trickling its body cannot hold a request open for long.
Large bodies are parsed in a worker thread so one big rollout does not stall
the event loop.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
from starlette.requests import ClientDisconnect, Request

from token_finalizer._constants import (
    MAX_JSON_DEPTH,
    PARSE_IN_THREAD_MIN_BYTES,
    REQUEST_BODY_MIN_BYTES_PER_S,
    REQUEST_BODY_TIMEOUT_S,
)
from token_finalizer.core.codec import (
    json_depth,
    json_type_name,
    loads_exact_json,
    lone_surrogate_at,
)
from token_finalizer.web.deadlines import request_body_timeout_s
from token_finalizer.web.errors import HttpError

__all__ = ["JsonBody", "read_json_object"]

# A `\uD800`-`\uDFFF` escape: the only way a body's JSON spells a surrogate.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


@dataclass(frozen=True, slots=True)
class JsonBody:
    """A parsed request body and its size on the wire (which decides threading later)."""

    data: dict[str, Any]
    size: int

    @property
    def large(self) -> bool:
        """Whether work proportional to this body belongs in a worker thread."""
        return self.size >= PARSE_IN_THREAD_MIN_BYTES


def _declared_length(request: Request) -> int | None:
    header = request.headers.get("content-length")
    if header is None:
        return None
    try:
        length = int(header)
    except ValueError:
        raise HttpError(400, f"Content-Length {header!r} is not an integer") from None
    if length < 0:
        raise HttpError(400, f"Content-Length {header!r} is negative")
    return length


async def _read_limited(request: Request, limit: int, limit_name: str) -> bytearray:
    too_large = HttpError(413, f"request body is larger than {limit_name} ({limit} bytes)")
    declared = _declared_length(request)
    if declared is not None and declared > limit:
        raise too_large
    body = bytearray()
    try:
        timeout_s = request_body_timeout_s()
    except ValueError:  # the CLI refuses to start with it; an embedding gets the default
        timeout_s = REQUEST_BODY_TIMEOUT_S
    started = anyio.current_time()
    # One deadline for the whole body, which every byte received pushes back a
    # little: a body arriving at a modest rate always makes it, a trickle never does.
    with anyio.CancelScope(deadline=started + timeout_s) as deadline:
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise too_large
                deadline.deadline = started + timeout_s + len(body) / REQUEST_BODY_MIN_BYTES_PER_S
        except ClientDisconnect:
            raise HttpError(400, "the client disconnected before sending the whole body") from None
    if deadline.cancelled_caught:
        raise HttpError(
            408,
            f"the request body did not arrive in time ({len(body)} bytes in "
            f"{anyio.current_time() - started:.0f} s; a body may take {timeout_s:g} s plus 1 s "
            f"per {REQUEST_BODY_MIN_BYTES_PER_S} bytes received)",
            # The rest of the body is never read: the connection cannot be reused.
            headers={"Connection": "close"},
        )
    return body


def _check_media_type(request: Request, invalid_status: int) -> None:
    """Refuse bodies not sent as JSON before reading them.

    A web page can make a browser POST `text/plain` or a form to a service on
    the same host without any preflight; insisting on `application/json`
    (which needs one) keeps such pages from freezing captures.
    """
    header = request.headers.get("content-type")
    if header is None and request.headers.get("content-length") == "0":
        return  # no body at all: the caller decides whether an empty body is fine
    media_type = (header or "").partition(";")[0].strip().lower()
    if media_type != "application/json" and not media_type.endswith("+json"):
        raise HttpError(
            invalid_status,
            f"request body must be sent as Content-Type: application/json, got {header!r}",
        )


async def read_json_object(
    request: Request,
    *,
    limit: int,
    limit_name: str = "the limit",
    invalid_status: int = 400,
    allow_empty: bool = False,
    allow_non_finite: bool = False,
    require_json_media_type: bool = False,
) -> JsonBody:
    """The request body as a JSON object; HttpError (`invalid_status` or 413) when it is not one.

    `allow_empty` reads an empty body as `{}` (protocol calls whose body is optional).
    `allow_non_finite` admits NaN/Infinity, which Python writers put in log probs;
    finalize bodies refuse them, since a record could not be answered as valid JSON.
    `require_json_media_type` refuses bodies not sent as `application/json`.
    """

    def parse(text: bytes) -> Any:
        # Checked before parsing: a record nested deeper than the encoder can
        # write back would otherwise be refused only after its capture froze.
        # A body with no more openers than the limit cannot nest deeper: two C
        # counts spare the small bodies of the model server's hot path the scan.
        if text.count(b"[") + text.count(b"{") > MAX_JSON_DEPTH:
            depth = json_depth(text)
            if depth > MAX_JSON_DEPTH:
                raise HttpError(
                    invalid_status,
                    f"request body JSON nests {depth} levels deep; "
                    f"at most {MAX_JSON_DEPTH} are accepted",
                )
        data = loads_exact_json(text, allow_non_finite=allow_non_finite)
        # orjson refuses a lone surrogate, the stdlib fallback (NaN, wide integers)
        # does not: a string that can never be encoded again is refused here, once.
        # Only a body spelling a surrogate escape at all is walked.
        if b"\\u" in text and _SURROGATE_ESCAPE.search(text):
            where = lone_surrogate_at(data)
            if where is not None:
                raise HttpError(
                    invalid_status,
                    f"{where} holds a lone surrogate (\\ud800-\\udfff), which is not text",
                )
        return data

    if require_json_media_type:
        declared = _declared_length(request)
        if declared is not None and declared > limit:
            raise HttpError(413, f"request body is larger than {limit_name} ({limit} bytes)")
        _check_media_type(request, invalid_status)
    body = await _read_limited(request, limit, limit_name)
    if not body.strip():
        if allow_empty:
            return JsonBody(data={}, size=0)
        raise HttpError(invalid_status, "request body is empty; expected a JSON object")
    try:
        if len(body) >= PARSE_IN_THREAD_MIN_BYTES:
            data = await anyio.to_thread.run_sync(parse, bytes(body))
        else:
            data = parse(bytes(body))
    except ValueError as exc:
        raise HttpError(invalid_status, f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise HttpError(
            invalid_status,
            f"request body must be a JSON object, got a JSON {json_type_name(data)}",
        )
    return JsonBody(data=data, size=len(body))
