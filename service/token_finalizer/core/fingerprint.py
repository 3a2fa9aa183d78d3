"""Conversation fingerprints, version 2, bit-exact with NeMo Gym 0.7 (docs/records-and-builds.md).

Two hashes over request/response items of any serving dialect (Chat messages,
Responses items, Anthropic content blocks):

- ``assistant_fingerprint`` covers only what the model wrote; it is the key a
  continuation is looked up by, so user turns and tool output added between
  calls do not change it.
- ``conversation_digest`` covers every item, tool results included; it proves
  the looked-up call saw exactly the context this request starts with.

Every hashed field is framed as one tag byte, an 8-byte big-endian length and
the UTF-8 bytes, so no two different field sequences hash the same input.
Anything the normalization does not understand raises ``FingerprintError``
rather than being skipped: a silently ignored block could make two different
conversations look identical.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

__all__ = [
    "FINGERPRINT_VERSION",
    "FingerprintError",
    "assistant_fingerprint",
    "canonical_arguments",
    "canonical_json",
    "context_digests",
    "conversation_digest",
    "is_model_authored",
]

FINGERPRINT_VERSION = 2

_ASSISTANT_DOMAIN = b"nemo-gym-lineage"
_CONTEXT_DOMAIN = b"nemo-gym-lineage-context"
_TEXT = b"text"
_TEXT_BLOCK_TYPES = frozenset({"", "text", "input_text", "output_text"})
# Tool blocks are hashed as tool calls / tool results, never as content parts.
_TOOL_BLOCK_TYPES = frozenset({"tool_use", "tool_result"})

# A content part is (type, payload); a tool call is (id, name, arguments);
# a tool result is (call id, output). All already UTF-8 encoded.
_Part = tuple[bytes, bytes]
_ToolCall = tuple[bytes, bytes, bytes]


class FingerprintError(ValueError):
    """The items cannot be fingerprinted: not JSON objects, or a shape the rules do not define."""


def canonical_json(value: Any) -> bytes:
    """Compact JSON with sorted keys, as orjson writes it (NaN and infinities become null)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError as error:  # orjson.JSONEncodeError is a TypeError
        raise FingerprintError(f"not canonical JSON: {error}") from error


def canonical_arguments(value: Any) -> str:
    """Tool-call arguments in the form compared across re-serializations.

    Harnesses often re-encode a call's JSON arguments between turns, so a string
    that parses as JSON is compared by its canonical JSON; a string that does not
    parse is compared stripped; null is the empty string.
    """
    return _canonical_arguments(value).decode("utf-8")


def is_model_authored(item: dict[str, Any]) -> bool:
    """Whether the model wrote this item: an assistant message or a function call."""
    return item.get("role") == "assistant" or item.get("type") == "function_call"


def assistant_fingerprint(items: Iterable[Any] | None) -> str:
    """Hash of the model-authored items, in order; "" when there is none."""
    hasher = hashlib.sha256(_ASSISTANT_DOMAIN)
    found = False
    for item in items or ():
        _require_object(item)
        if not is_model_authored(item):
            continue
        found = True
        for part_type, payload in _content_parts(item.get("content")):
            _update(hasher, 0, part_type)
            _update(hasher, 1, payload)
        for call_id, name, arguments in _tool_calls(item):
            _update(hasher, 2, call_id)
            _update(hasher, 3, name)
            _update(hasher, 4, arguments)
    return hasher.hexdigest() if found else ""


def conversation_digest(items: Iterable[Any] | None) -> str:
    """Hash of every item of a conversation (roles, content, tool calls and results)."""
    hasher = hashlib.sha256(_CONTEXT_DOMAIN)
    for item in items or ():
        _update_with_item(hasher, item)
    return hasher.hexdigest()


def context_digests(items: Sequence[Any]) -> list[str]:
    """``[conversation_digest(items[:k]) for k in 0..len(items)]`` in one pass.

    The digest is a stream over items, so each prefix's value is read from a
    copy of the running hash state instead of rehashing the prefix.
    """
    hasher = hashlib.sha256(_CONTEXT_DOMAIN)
    digests = [hasher.copy().hexdigest()]
    for item in items:
        _update_with_item(hasher, item)
        digests.append(hasher.copy().hexdigest())
    return digests


def _update_with_item(hasher: Any, item: Any) -> None:
    """Feed one item's conversation-digest fields to ``hasher``."""
    _require_object(item)
    _update(hasher, 0, _utf8(str(item.get("role") or item.get("type") or "")))
    for part_type, payload in _content_parts(item.get("content")):
        _update(hasher, 1, part_type)
        _update(hasher, 2, payload)
    for call_id, name, arguments in _tool_calls(item):
        _update(hasher, 3, call_id)
        _update(hasher, 4, name)
        _update(hasher, 5, arguments)
    for call_id, output in _tool_results(item):
        _update(hasher, 6, call_id)
        _update(hasher, 7, output)


def _require_object(item: Any) -> None:
    if not isinstance(item, dict):
        raise FingerprintError(f"an item must be a JSON object, got {type(item).__name__}")


def _content_parts(content: Any) -> list[_Part]:
    """The typed parts of a ``content`` field; tool blocks are left to the tool helpers."""
    if content is None:
        return []
    if isinstance(content, str):
        return [(_TEXT, _utf8(content))] if content else []
    if not isinstance(content, list):
        raise FingerprintError(f"content must be a string or a list, got {type(content).__name__}")
    parts: list[_Part] = []
    for block in content:
        if isinstance(block, str):
            if block:
                parts.append((_TEXT, _utf8(block)))
            continue
        if not isinstance(block, dict):
            raise FingerprintError(f"a content block must be a string or an object, got {block!r}")
        block_type = str(block.get("type") or "")
        if block_type in _TOOL_BLOCK_TYPES:
            continue
        text = block.get("text")
        if isinstance(text, str) and block_type in _TEXT_BLOCK_TYPES:
            if text:
                parts.append((_TEXT, _utf8(text)))
            continue
        if not block_type:
            raise FingerprintError("a content block without a type must carry string text")
        # Images, audio, reasoning blocks...: the whole block is the payload, so
        # any change to it changes the hash.
        parts.append((_utf8(block_type), canonical_json(block)))
    return parts


def _tool_calls(item: dict[str, Any]) -> list[_ToolCall]:
    """Tool calls in hashing order: the item itself, ``tool_use`` blocks, ``tool_calls[]``."""
    calls: list[_ToolCall] = []
    if item.get("type") == "function_call":
        name = str(item.get("name", ""))
        namespace = item.get("namespace")
        if namespace:
            # Streamed calls carry the namespace apart from the name; joined, two
            # tools sharing a short name in different namespaces stay distinct.
            name = f"{namespace}__{name}"
        calls.append(
            (
                _utf8(str(item.get("call_id") or item.get("id") or "")),
                _utf8(name),
                _canonical_arguments(item.get("arguments")),
            )
        )
    content = item.get("content")
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                calls.append(
                    (
                        _utf8(str(block.get("id") or "")),
                        _utf8(str(block.get("name", ""))),
                        _canonical_arguments(block.get("input")),
                    )
                )
    for call in _chat_tool_calls(item.get("tool_calls")):
        function = _object_or_empty(call.get("function"))
        calls.append(
            (
                _utf8(str(call.get("id") or "")),
                _utf8(str(function.get("name", ""))),
                _canonical_arguments(function.get("arguments")),
            )
        )
    return calls


def _chat_tool_calls(value: Any) -> list[dict[str, Any]]:
    """The objects of a Chat ``tool_calls`` field, with NeMo Gym's falsy-means-empty reading.

    A falsy field or element counts as empty. Iterating an object walks its
    keys, so only an object whose keys are all "" (each an empty call) passes;
    any other non-list value is invalid.
    """
    if not value:
        return []
    if not isinstance(value, list | dict):
        raise FingerprintError(f"tool_calls must be a list, got {type(value).__name__}")
    return [_object_or_empty(call) for call in value]


def _object_or_empty(value: Any) -> dict[str, Any]:
    if not value:
        return {}
    if not isinstance(value, dict):
        raise FingerprintError(f"expected an object, got {type(value).__name__}")
    return value


def _tool_results(item: dict[str, Any]) -> list[_Part]:
    """Tool results in hashing order: the item itself, then ``tool_result`` blocks."""
    results: list[_Part] = []
    if item.get("type") == "function_call_output":
        call_id = item.get("call_id") or item.get("id") or ""
        results.append((_utf8(str(call_id)), _payload(item.get("output"))))
    elif item.get("role") == "tool":
        call_id = item.get("tool_call_id") or ""
        results.append((_utf8(str(call_id)), _payload(item.get("content"))))
    content = item.get("content")
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                call_id = block.get("tool_use_id") or block.get("id") or ""
                results.append((_utf8(str(call_id)), _payload(block.get("content"))))
    return results


def _payload(value: Any) -> bytes:
    """A tool output: a string as is, anything else (null included) as canonical JSON."""
    return _utf8(value) if isinstance(value, str) else canonical_json(value)


def _canonical_arguments(value: Any) -> bytes:
    if value is None:
        return b""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            # Not JSON (or an integer too long for Python to parse): compare the text.
            return _utf8(value.strip())
        except RecursionError as error:
            raise FingerprintError("tool-call arguments nest too deeply") from error
        return canonical_json(parsed)
    return canonical_json(value)


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as error:  # lone surrogates, e.g. from a "\ud800" escape
        raise FingerprintError(f"text is not valid Unicode: {error}") from error


def _update(hasher: Any, tag: int, value: bytes) -> None:
    """Hash one framed field: tag byte, 8-byte big-endian length, bytes."""
    hasher.update(bytes((tag,)) + len(value).to_bytes(8, "big"))
    hasher.update(value)
