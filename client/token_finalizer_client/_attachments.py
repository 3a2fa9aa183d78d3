"""Attachments of a staged call on the wire: bytes as base64, JSON values as they are.

A worker may stage framework-owned payloads with a call (processed media,
say). NeMo Gym never reads them; the store keeps them in the same durable
write as the record, and a trainer reads them back exactly as staged
(docs/staging.md#the-client):

    {"pixels": b"\\x00\\x01", "spans": [[0, 4]]}
    -> {"pixels": {"bytes": "AAE="}, "spans": {"json": [[0, 4]]}}

Bytes (`bytes`, `bytearray`, `memoryview`) come back as `bytes`; a JSON
value (dict with string keys, list, str, int, finite float, bool, None, at
most `MAX_ATTACHMENT_DEPTH` containers deep) comes back equal. Anything
else (a tuple, which would come back a list; a numpy array; NaN) is refused
with `AttachmentError` before anything is sent: an attachment is never
dropped or changed silently.
"""

from __future__ import annotations

import binascii
import math
from collections.abc import Mapping
from typing import Any

from token_finalizer_client._constants import MAX_ATTACHMENT_DEPTH
from token_finalizer_client._exceptions import InvalidAnswerError

__all__ = ["AttachmentError", "decode_attachments", "encode_attachments"]

_BYTES = "bytes"
_JSON = "json"


class AttachmentError(ValueError):
    """An attachment this client cannot store exactly: its name says which."""


def _json_problem(value: Any) -> str | None:
    """Why `value` is not a plain JSON value (None when it is one); no recursion."""
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if item is None or type(item) in (str, int, bool):
            continue
        if type(item) is float:
            if not math.isfinite(item):
                return f"holds the non-finite number {item!r}"
            continue
        if type(item) not in (dict, list):
            return f"holds a {type(item).__name__}, which is neither bytes nor a JSON value"
        if depth >= MAX_ATTACHMENT_DEPTH:
            return f"nests more than {MAX_ATTACHMENT_DEPTH} containers deep"
        if type(item) is dict:
            if any(type(key) is not str for key in item):
                return "holds an object whose keys are not all strings"
            pending.extend((child, depth + 1) for child in item.values())
        else:
            pending.extend((child, depth + 1) for child in item)
    return None


def encode_attachments(attachments: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The wire form of `attachments` (None stays None); AttachmentError for one it cannot hold."""
    if attachments is None:
        return None
    if not isinstance(attachments, Mapping):
        raise AttachmentError(f"attachments must be a mapping, got {type(attachments).__name__}")
    encoded: dict[str, Any] = {}
    for name, value in attachments.items():
        if type(name) is not str or not name:
            raise AttachmentError(f"attachment names must be non-empty strings, got {name!r:.80}")
        if isinstance(value, bytes | bytearray | memoryview):
            encoded[name] = {_BYTES: binascii.b2a_base64(value, newline=False).decode("ascii")}
            continue
        problem = _json_problem(value)
        if problem is not None:
            raise AttachmentError(f"attachment {name!r} {problem}")
        encoded[name] = {_JSON: value}
    return encoded


def _decoded(name: str, value: object) -> Any:
    if isinstance(value, dict) and len(value) == 1:
        if _JSON in value:
            return value[_JSON]
        data = value.get(_BYTES)
        if isinstance(data, str):
            try:
                return binascii.a2b_base64(data, strict_mode=True)
            except (binascii.Error, ValueError):
                raise InvalidAnswerError(f"attachment {name!r} is not standard base64") from None
    raise InvalidAnswerError(
        f"attachment {name!r} is neither {{'bytes': base64}} nor {{'json': value}}: {value!r:.200}"
    )


def decode_attachments(wire: object) -> dict[str, Any]:
    """`{name: value}` from an answer's wire form (null: none); InvalidAnswerError otherwise."""
    if wire is None:
        return {}
    if not isinstance(wire, dict):
        raise InvalidAnswerError(f"the attachments are not an object: {wire!r:.200}")
    return {str(name): _decoded(str(name), value) for name, value in wire.items()}
