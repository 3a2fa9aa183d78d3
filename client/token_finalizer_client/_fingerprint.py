"""Conversation fingerprints v2, bit-exact with NeMo Gym 0.7 (docs/records-and-builds.md).

The project's one implementation: `HttpLineageResolver` hashes a request's
items with it and sends only the hashes, and the service's lineage
resolution and terminal attribution compare against the same functions
(both import them from `token_finalizer_client.protocol`).

- `assistant_fingerprint(items)`: what the model wrote (assistant messages,
  function calls), the key a continuation is looked up by; "" when nothing.
  User turns and tool output added between calls do not change it.
- `conversation_digest(items)`: every item, tool results included; the proof
  that a looked-up call saw exactly the context a request starts with.
- `context_digests(items)`: `conversation_digest(items[:k])` for every k.

Each hashed field is one tag byte, its length as 8 big-endian bytes, then its
UTF-8 bytes, so no two different field sequences hash the same input. Input
the rules do not define raises `FingerprintError` rather than being skipped:
a silently ignored block could make two different conversations look alike.

Canonical JSON (for non-text content blocks, tool arguments and tool outputs)
is `orjson.dumps(value, option=OPT_SORT_KEYS)`. orjson is used when installed
(the service always has it; a client gets it with the `fast` extra); without
it, `_StdlibCanonical` writes the same bytes with the standard library: sorted
keys, no whitespace, raw UTF-8, floats in orjson's shortest form, NaN and
infinities as null, integers in [-2**63, 2**64), at most 254 nested
containers, and the types orjson accepts by default for request items (dict
and list and their subclasses, tuple, str and int subclasses); anything else
is refused, which the resolver answers as a failed lookup, never as a
different hash.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import re
import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

__all__ = [
    "FINGERPRINT_VERSION",
    "HEX_DIGEST",
    "FingerprintError",
    "assistant_fingerprint",
    "canonical_arguments",
    "canonical_json",
    "context_digests",
    "conversation_digest",
    "is_model_authored",
]

FINGERPRINT_VERSION = 2
# How every digest of the protocol is written: 64 lowercase hex digits (SHA-256).
HEX_DIGEST = re.compile(r"[0-9a-f]{64}")

_LOOKUP_DOMAIN = b"nemo-gym-lineage"
_CONTEXT_DOMAIN = b"nemo-gym-lineage-context"
_TEXT = b"text"
_PLAIN_TEXT_BLOCKS = ("", "text", "input_text", "output_text")
_TOOL_BLOCKS = ("tool_use", "tool_result")

# orjson's limits, kept by the standard-library encoder.
_MAX_DEPTH = 254
_INT_MIN = -(2**63)
_INT_END = 2**64


def _import_orjson() -> Any:
    try:
        return importlib.import_module("orjson")
    except ImportError:
        return None


# None when orjson is not installed (tests set it to None to take the stdlib path).
_orjson: Any = _import_orjson()


class FingerprintError(ValueError):
    """Items that cannot be fingerprinted: not JSON objects, or a shape the rules leave open."""


# -- canonical JSON -------------------------------------------------------------------


def canonical_json(value: Any) -> bytes:
    """`orjson.dumps(value, option=OPT_SORT_KEYS)`, by orjson or by the standard library."""
    if _orjson is not None:
        try:
            encoded: bytes = _orjson.dumps(value, option=_orjson.OPT_SORT_KEYS)
            return encoded
        except TypeError as error:  # orjson.JSONEncodeError is a TypeError
            raise FingerprintError(f"not canonical JSON: {error}") from error
    return _StdlibCanonical().encode(value)


def _shortest_float(value: float) -> str:
    """A finite float as orjson writes it: shortest round-trip digits, ryu's layout, `e+`."""
    text = repr(value)  # the shortest digits that round-trip, like orjson's
    sign = ""
    if text.startswith("-"):
        sign, text = "-", text[1:]
    mantissa, _, exponent = text.partition("e")
    whole, _, fraction = mantissa.partition(".")
    all_digits = whole + fraction
    significant = all_digits.lstrip("0")
    # value = 0.<digits> * 10**point
    point = len(whole) + int(exponent or 0) - (len(all_digits) - len(significant))
    digits = significant.rstrip("0")
    if not digits:
        return sign + "0.0"
    count = len(digits)
    if count <= point <= 16:
        body = digits + "0" * (point - count) + ".0"
    elif 0 < point <= 16:
        body = f"{digits[:point]}.{digits[point:]}"
    elif -5 < point <= 0:
        body = "0." + "0" * -point + digits
    else:
        scale = point - 1
        lead = digits if count == 1 else f"{digits[0]}.{digits[1:]}"
        body = f"{lead}e{'+' if scale >= 0 else '-'}{abs(scale)}"
    return sign + body


class _StdlibCanonical:
    """orjson's canonical bytes, written with the standard library (see the module docstring)."""

    def __init__(self) -> None:
        self._parts: list[str] = []

    def encode(self, value: Any) -> bytes:
        self._write(value, 0)
        try:
            return "".join(self._parts).encode("utf-8")
        except UnicodeEncodeError as error:  # a lone surrogate, as orjson refuses it
            raise FingerprintError(f"not canonical JSON: str is not valid UTF-8: {error}") from None

    def _write(self, value: Any, depth: int) -> None:
        parts = self._parts
        if value is None:
            parts.append("null")
        elif value is True:
            parts.append("true")
        elif value is False:
            parts.append("false")
        elif isinstance(value, str):
            parts.append(json.encoder.encode_basestring(value))
        elif isinstance(value, int):
            if not _INT_MIN <= value < _INT_END:
                raise FingerprintError("not canonical JSON: integer exceeds 64-bit range")
            parts.append(int.__repr__(value))
        elif type(value) is float:
            parts.append(_shortest_float(value) if math.isfinite(value) else "null")
        elif isinstance(value, dict):
            self._write_object(value, depth + 1)
        elif isinstance(value, list) or type(value) is tuple:
            self._write_array(value, depth + 1)
        else:
            raise FingerprintError(
                f"not canonical JSON: type is not JSON serializable: {type(value).__name__}"
            )

    def _check_depth(self, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise FingerprintError("not canonical JSON: recursion limit reached")

    def _write_object(self, value: dict[Any, Any], depth: int) -> None:
        self._check_depth(depth)
        if any(type(key) is not str for key in value):
            raise FingerprintError("not canonical JSON: dict key must be str")
        self._parts.append("{")
        for index, key in enumerate(sorted(value)):
            if index:
                self._parts.append(",")
            self._parts.append(json.encoder.encode_basestring(key))
            self._parts.append(":")
            self._write(value[key], depth)
        self._parts.append("}")

    def _write_array(self, value: Sequence[Any], depth: int) -> None:
        self._check_depth(depth)
        self._parts.append("[")
        for index, element in enumerate(value):
            if index:
                self._parts.append(",")
            self._write(element, depth)
        self._parts.append("]")


# -- what is hashed ---------------------------------------------------------------------


def _encoded(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise FingerprintError(f"text is not valid Unicode: {error}") from None


def canonical_arguments(value: Any) -> str:
    """Tool-call arguments in the form compared across re-serializations.

    Harnesses often re-encode a call's JSON arguments between turns, so a
    string that parses as JSON is compared by its canonical JSON; a string that
    does not parse is compared stripped; null is the empty string.
    """
    return _arguments(value).decode("utf-8")


def _arguments(value: Any) -> bytes:
    """`canonical_arguments` as the bytes that are hashed."""
    if value is None:
        return b""
    if not isinstance(value, str):
        return canonical_json(value)
    try:
        parsed = json.loads(value)
    except RecursionError:
        raise FingerprintError("tool-call arguments nest too deeply") from None
    except ValueError:
        return _encoded(value.strip())
    return canonical_json(parsed)


def _output(value: Any) -> bytes:
    """A tool result's payload: text as it is, anything else as canonical JSON."""
    return _encoded(value) if isinstance(value, str) else canonical_json(value)


def _object(value: Any) -> dict[str, Any]:
    """An object field read the way the reference reads it: anything falsy is {}."""
    if not value:
        return {}
    if not isinstance(value, dict):
        raise FingerprintError(f"expected an object, got {type(value).__name__}")
    return value


def _as_item(item: Any) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise FingerprintError(f"an item must be a JSON object, got {type(item).__name__}")
    return item


def is_model_authored(item: dict[str, Any]) -> bool:
    """Whether the model wrote this item: an assistant message or a function call."""
    return item.get("role") == "assistant" or item.get("type") == "function_call"


def _content(content: Any) -> Iterator[tuple[bytes, bytes]]:
    """(part type, payload) of each content part; tool blocks are hashed as tools instead."""
    if content is None:
        return
    if isinstance(content, str):
        if content:
            yield _TEXT, _encoded(content)
        return
    if not isinstance(content, list):
        raise FingerprintError(f"content must be a string or a list, got {type(content).__name__}")
    for block in content:
        if isinstance(block, str):
            if block:
                yield _TEXT, _encoded(block)
            continue
        if not isinstance(block, dict):
            raise FingerprintError(f"a content block must be a string or an object: {block!r:.80}")
        kind = str(block.get("type") or "")
        if kind in _TOOL_BLOCKS:
            continue
        text = block.get("text")
        if kind in _PLAIN_TEXT_BLOCKS and isinstance(text, str):
            if text:
                yield _TEXT, _encoded(text)
            continue
        if not kind:
            raise FingerprintError("a content block without a type must carry string text")
        yield _encoded(kind), canonical_json(block)


def _tool_calls(item: dict[str, Any]) -> Iterator[tuple[bytes, bytes, bytes]]:
    """(call id, name, canonical arguments): the item itself, tool_use blocks, then tool_calls."""
    if item.get("type") == "function_call":
        name = str(item.get("name", ""))
        if item.get("namespace"):
            name = f"{item['namespace']}__{name}"
        call_id = str(item.get("call_id") or item.get("id") or "")
        yield _encoded(call_id), _encoded(name), _arguments(item.get("arguments"))
    content = item.get("content")
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                yield (
                    _encoded(str(block.get("id") or "")),
                    _encoded(str(block.get("name", ""))),
                    _arguments(block.get("input")),
                )
    listed = item.get("tool_calls")
    if not listed:
        return
    if not isinstance(listed, list | dict):
        raise FingerprintError(f"tool_calls must be a list, got {type(listed).__name__}")
    # Iterating an object walks its keys: only keys that are all "" (empty calls) pass.
    for element in listed:
        call = _object(element)
        function = _object(call.get("function"))
        yield (
            _encoded(str(call.get("id") or "")),
            _encoded(str(function.get("name", ""))),
            _arguments(function.get("arguments")),
        )


def _tool_results(item: dict[str, Any]) -> Iterator[tuple[bytes, bytes]]:
    """(call id, output): the item itself (function_call_output or tool message), then blocks."""
    if item.get("type") == "function_call_output":
        call_id = item.get("call_id") or item.get("id") or ""
        yield _encoded(str(call_id)), _output(item.get("output"))
    elif item.get("role") == "tool":
        yield _encoded(str(item.get("tool_call_id") or "")), _output(item.get("content"))
    content = item.get("content")
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                call_id = block.get("tool_use_id") or block.get("id") or ""
                yield _encoded(str(call_id)), _output(block.get("content"))


def _lookup_fields(item: dict[str, Any]) -> Iterator[tuple[int, bytes]]:
    for kind, payload in _content(item.get("content")):
        yield 0, kind
        yield 1, payload
    for call_id, name, arguments in _tool_calls(item):
        yield 2, call_id
        yield 3, name
        yield 4, arguments


def _context_fields(item: dict[str, Any]) -> Iterator[tuple[int, bytes]]:
    yield 0, _encoded(str(item.get("role") or item.get("type") or ""))
    for kind, payload in _content(item.get("content")):
        yield 1, kind
        yield 2, payload
    for call_id, name, arguments in _tool_calls(item):
        yield 3, call_id
        yield 4, name
        yield 5, arguments
    for call_id, output in _tool_results(item):
        yield 6, call_id
        yield 7, output


# Each field's head: its tag (one byte) and its length (eight, big-endian).
_FIELD_HEAD = struct.Struct(">BQ").pack


def _absorb(hasher: Any, fields: Iterable[tuple[int, bytes]]) -> None:
    # One update per field: a model server hashes every item before each call.
    update = hasher.update
    for tag, value in fields:
        update(_FIELD_HEAD(tag, len(value)) + value)


# -- the hashes -----------------------------------------------------------------------------


def assistant_fingerprint(items: Iterable[Any] | None) -> str:
    """Hex SHA-256 of the model-authored items in order; "" when the items hold none."""
    hasher = hashlib.sha256(_LOOKUP_DOMAIN)
    any_authored = False
    for item in items or ():
        if is_model_authored(_as_item(item)):
            any_authored = True
            _absorb(hasher, _lookup_fields(item))
    return hasher.hexdigest() if any_authored else ""


def conversation_digest(items: Iterable[Any] | None) -> str:
    """Hex SHA-256 of every item (roles, content, tool calls and tool results)."""
    hasher = hashlib.sha256(_CONTEXT_DOMAIN)
    for item in items or ():
        _absorb(hasher, _context_fields(_as_item(item)))
    return hasher.hexdigest()


def context_digests(items: Sequence[Any]) -> list[str]:
    """`[conversation_digest(items[:k]) for k in 0..len(items)]`, in one pass over the items."""
    hasher = hashlib.sha256(_CONTEXT_DOMAIN)
    digests = [hasher.hexdigest()]
    for item in items:
        _absorb(hasher, _context_fields(_as_item(item)))
        digests.append(hasher.hexdigest())
    return digests
