"""Reading a JSON-object request body within the configured size limit.

A body over the limit is refused from its Content-Length before a byte of it
is read, and a chunked body (no length announced) is cut off as soon as it
grows past the limit, so a runaway client cannot make the service buffer it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio.to_thread
import orjson
from starlette.requests import ClientDisconnect, Request

from token_finalizer._constants import PARSE_IN_THREAD_MIN_BYTES
from token_finalizer.api.errors import ApiError

__all__ = ["JsonBody", "read_json_object"]


@dataclass(frozen=True, slots=True)
class JsonBody:
    """A parsed request body and its size on the wire (which decides threading later)."""

    data: dict[str, Any]
    size: int

    @property
    def large(self) -> bool:
        """Whether work proportional to this body belongs in a worker thread."""
        return self.size >= PARSE_IN_THREAD_MIN_BYTES


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"request body is larger than limits.max_body_bytes ({limit} bytes)")


def _declared_length(request: Request) -> int | None:
    header = request.headers.get("content-length")
    if header is None:
        return None
    try:
        length = int(header)
    except ValueError:
        raise ApiError(400, f"Content-Length {header!r} is not an integer") from None
    if length < 0:
        raise ApiError(400, f"Content-Length {header!r} is negative")
    return length


async def _read_limited(request: Request, limit: int) -> bytearray:
    declared = _declared_length(request)
    if declared is not None and declared > limit:
        raise _too_large(limit)
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise _too_large(limit)
    except ClientDisconnect:
        raise ApiError(400, "the client disconnected before sending the whole body") from None
    return body


def _parse(body: bytearray) -> Any:
    return orjson.loads(body)


async def read_json_object(request: Request, limit: int) -> JsonBody:
    """The request body as a JSON object; ApiError 400/413 when it is not one."""
    body = await _read_limited(request, limit)
    if not body.strip():
        raise ApiError(400, "request body is empty; expected a JSON object")
    try:
        if len(body) >= PARSE_IN_THREAD_MIN_BYTES:
            data = await anyio.to_thread.run_sync(_parse, body)
        else:
            data = _parse(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"request body must be a JSON object, got a JSON {_json_type(data)}")
    return JsonBody(data=data, size=len(body))


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"
