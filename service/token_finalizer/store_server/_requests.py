"""Protocol v1 requests: bodies read within a size limit, ids and fields checked.

Every refusal is a RequestRefusedError carrying its status (422 for anything
malformed, 413 for too large) and a message naming what is wrong.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import ClientDisconnect, Request

from token_finalizer.identity import check_store_id
from token_finalizer.records import loads_json

__all__ = [
    "RequestRefusedError",
    "call_entry",
    "drop_target",
    "optional_call_id",
    "read_object",
    "required_call_id",
]


class RequestRefusedError(Exception):
    """A request the store refuses before touching any capture: status and message."""

    def __init__(self, message: str, status_code: int = 422) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message


async def _read_limited(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestRefusedError(f"request body is larger than {limit} bytes", 413)
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise RequestRefusedError(f"request body is larger than {limit} bytes", 413)
    except ClientDisconnect:
        raise RequestRefusedError(
            "the client disconnected before sending the whole body", 400
        ) from None
    return bytes(body)


async def read_object(request: Request, *, limit: int, allow_empty: bool = False) -> dict[str, Any]:
    """The request body as a JSON object (`{}` for an empty body when allowed)."""
    body = await _read_limited(request, limit)
    if not body.strip():
        if allow_empty:
            return {}
        raise RequestRefusedError("request body is empty; expected a JSON object")
    try:
        # loads_json, not plain orjson: a writer's stdlib JSON may carry -Infinity log probs.
        data = loads_json(body)
    except ValueError as exc:
        raise RequestRefusedError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RequestRefusedError(f"request body must be a JSON object, got {type(data).__name__}")
    return data


def call_entry(body: dict[str, Any], rollout_id: str, model_call_id: str) -> dict[str, Any]:
    """The TokenEntry a PUT stores: the path names the call, the body may repeat it, not differ.

    Both ids come from the path and were checked before the body was read.
    """
    for key, from_path in (("rollout_id", rollout_id), ("model_call_id", model_call_id)):
        if key not in body:
            body[key] = from_path
        elif body[key] != from_path:
            raise RequestRefusedError(
                f"body {key} {body[key]!r} differs from the path's {from_path!r}"
            )
    return body


def optional_call_id(body: dict[str, Any]) -> str:
    """`model_call_id` of an incomplete mark: absent or "" marks the rollout as a whole."""
    value = body.get("model_call_id", "")
    if value is None or value == "":
        return ""
    return check_store_id(value, what="model_call_id")


def required_call_id(body: dict[str, Any]) -> str:
    """`model_call_id` of an announced call."""
    if "model_call_id" not in body:
        raise RequestRefusedError("model_call_id is missing")
    return check_store_id(body["model_call_id"], what="model_call_id")


def drop_target(body: dict[str, Any]) -> tuple[str, int]:
    """(snapshot_id, version) of a drop request."""
    snapshot_id, version = body.get("snapshot_id"), body.get("version")
    if not isinstance(snapshot_id, str) or not snapshot_id:
        raise RequestRefusedError(f"snapshot_id must be a non-empty string, got {snapshot_id!r}")
    if isinstance(version, bool) or not isinstance(version, int):
        raise RequestRefusedError(f"version must be an integer, got {version!r}")
    return snapshot_id, version
