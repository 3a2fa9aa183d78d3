"""Fingerprints v2 (`token_finalizer_client.protocol`), bit-exact with NeMo Gym 0.7.0.

The project's one implementation: the lineage resolver hashes requests with
it and the service's core compares against it. Every vector test runs twice:
with orjson (the service, and a client with the `fast` extra) and with the
standard-library canonical JSON a client-only install uses; random item
lists hash alike both ways, and the standard-library encoder is compared
with orjson directly.
"""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.vectors import case_ids, load_vectors
from token_finalizer_client import _fingerprint as fingerprint
from token_finalizer_client.protocol import (
    FINGERPRINT_VERSION,
    FingerprintError,
    assistant_fingerprint,
    canonical_arguments,
    canonical_json,
    context_digests,
    conversation_digest,
    is_model_authored,
)

VECTORS = load_vectors("fingerprints.json")
ARGUMENTS = VECTORS["canonical_arguments"]
ITEMS = VECTORS["items"]
VALID_ITEMS = [case for case in ITEMS if "value" in case["conversation_digest"]]


@pytest.fixture(params=["orjson", "stdlib"])
def encoder(request: pytest.FixtureRequest) -> Iterator[str]:
    """Canonical JSON by orjson, then by the standard library alone."""
    assert fingerprint._orjson is not None, "orjson is a test dependency (via the service)"
    if request.param == "orjson":
        yield "orjson"
    else:
        with mock.patch.object(fingerprint, "_orjson", None):
            yield "stdlib"


def _outcome(function: Callable[[Any], Any], argument: Any) -> tuple[str, Any]:
    """("value", result), or ("invalid", None) when the input is refused as not fingerprintable."""
    try:
        return "value", function(argument)
    except FingerprintError:
        return "invalid", None


def _expected(case: dict[str, Any]) -> tuple[str, Any]:
    return ("invalid", None) if "error" in case else ("value", case["value"])


# -- the committed vectors ---------------------------------------------------------------------


@pytest.mark.parametrize("case", ARGUMENTS, ids=case_ids(ARGUMENTS))
def test_canonical_arguments_match_reference(encoder: str, case: dict[str, Any]) -> None:
    """Tool-call arguments canonicalize exactly as the reference does, or are refused as it says."""
    assert _outcome(canonical_arguments, case["value"]) == _expected(case)


@pytest.mark.parametrize("case", ITEMS, ids=case_ids(ITEMS))
def test_assistant_fingerprint_matches_reference(encoder: str, case: dict[str, Any]) -> None:
    """assistant_fingerprint equals the reference hex (or "" / invalid input)."""
    expected = _expected(case["assistant_fingerprint"])
    assert _outcome(assistant_fingerprint, case["items"]) == expected


@pytest.mark.parametrize("case", ITEMS, ids=case_ids(ITEMS))
def test_conversation_digest_matches_reference(encoder: str, case: dict[str, Any]) -> None:
    """conversation_digest equals the reference hex, or the input is invalid."""
    expected = _expected(case["conversation_digest"])
    assert _outcome(conversation_digest, case["items"]) == expected


@pytest.mark.parametrize("case", VALID_ITEMS, ids=case_ids(VALID_ITEMS))
def test_context_digests_are_the_prefix_digests(encoder: str, case: dict[str, Any]) -> None:
    """context_digests(items)[k] == conversation_digest(items[:k]) for every k."""
    items = case["items"] or []
    expected = [conversation_digest(items[:k]) for k in range(len(items) + 1)]
    assert context_digests(items) == expected
    assert expected[-1] == case["conversation_digest"]["value"]


def test_resolution_vectors_hash_the_same(encoder: str) -> None:
    """The wire form of every resolution vector is what the items hash to."""
    for case in load_vectors("resolution.json")["cases"]:
        if case["request"] is None:
            continue
        items = case["request_items"]
        assert assistant_fingerprint(items) == case["request"]["fingerprint"]
        assert context_digests(items) == case["request"]["context_digests"]


# -- the rules, one at a time ------------------------------------------------------------------


def test_version_is_two() -> None:
    """The fingerprint algorithm version stamped on entries is 2."""
    assert FINGERPRINT_VERSION == 2


def test_fingerprint_error_is_a_value_error() -> None:
    """Callers catching ValueError also catch invalid fingerprint input."""
    assert issubclass(FingerprintError, ValueError)


def test_no_model_authored_item_gives_empty_fingerprint() -> None:
    """Without an assistant message or function call the fingerprint is "" (not a hash)."""
    assert assistant_fingerprint([{"role": "user", "content": "hi"}]) == ""


def test_user_turns_do_not_change_the_fingerprint() -> None:
    """Only model-authored items feed the fingerprint; the context digest sees the rest."""
    answer = {"role": "assistant", "content": "4"}
    first = [{"role": "user", "content": "2+2?"}, answer]
    second = [{"role": "user", "content": "two plus two?"}, answer]
    assert assistant_fingerprint(first) == assistant_fingerprint(second)
    assert conversation_digest(first) != conversation_digest(second)


def test_reserialized_arguments_fingerprint_the_same() -> None:
    """Re-encoding a call's JSON arguments (spacing, key order) keeps the fingerprint."""

    def call(arguments: str) -> list[dict[str, Any]]:
        return [{"type": "function_call", "call_id": "c", "name": "f", "arguments": arguments}]

    compact = assistant_fingerprint(call('{"a":1,"b":[2,3]}'))
    assert compact == assistant_fingerprint(call('{ "b": [2, 3], "a": 1 }'))


def test_tool_output_changes_the_context_digest_only() -> None:
    """A tool result is context: it changes the digest, not the fingerprint."""
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    one = [call, {"type": "function_call_output", "call_id": "c", "output": "1"}]
    two = [call, {"type": "function_call_output", "call_id": "c", "output": "2"}]
    assert assistant_fingerprint(one) == assistant_fingerprint(two)
    assert conversation_digest(one) != conversation_digest(two)


def test_deeply_nested_arguments_raise_fingerprint_error() -> None:
    """Arguments nested past the parser's recursion limit are invalid, not a RecursionError."""
    with pytest.raises(FingerprintError):
        canonical_arguments("[" * 5000 + "]" * 5000)


def test_invalid_item_in_context_digests_raises() -> None:
    """context_digests refuses an item that is not a JSON object."""
    with pytest.raises(FingerprintError):
        context_digests([{"role": "user", "content": "x"}, "not an item"])


def test_context_digests_of_nothing_is_the_empty_digest() -> None:
    """With no items, context_digests is [conversation_digest([])]."""
    assert context_digests([]) == [conversation_digest([])]


def test_canonical_json_sorts_keys_compactly(encoder: str) -> None:
    """canonical_json writes sorted keys, no spaces, raw UTF-8, NaN as null."""
    value = {"b": [1.0, float("nan")], "a": "é"}
    assert canonical_json(value) == '{"a":"é","b":[1.0,null]}'.encode()


def test_canonical_json_refuses_ints_beyond_uint64(encoder: str) -> None:
    """An integer of 2**64 or more cannot be canonical JSON."""
    with pytest.raises(FingerprintError):
        canonical_json({"x": 2**64})


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ({"role": "assistant"}, True),
        ({"type": "function_call"}, True),
        ({"type": "message", "role": "user"}, False),
        ({"type": "reasoning"}, False),
        ({"type": "function_call_output"}, False),
    ],
)
def test_model_authored_items(item: dict[str, Any], expected: bool) -> None:
    """Assistant messages and function calls are model-authored; reasoning and results are not."""
    assert is_model_authored(item) is expected


# -- random item lists ---------------------------------------------------------------------------

_TEXT = st.text(max_size=12)
_SCALARS = st.none() | st.booleans() | st.integers(-(2**65), 2**65) | st.floats() | _TEXT
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=12,
)
_ARGUMENTS = (
    _JSON
    | _JSON.map(lambda value: json.dumps(value, allow_nan=True))
    | _JSON.map(lambda value: " " + json.dumps(value, indent=1) + " ")
    | _TEXT
)
_ROLES = st.sampled_from(["assistant", "user", "system", "tool", "developer", "", None, 5])
_TYPES = st.sampled_from(
    ["message", "function_call", "function_call_output", "reasoning", "text", "", None]
)
_BLOCK_TYPES = st.sampled_from(
    ["text", "input_text", "output_text", "", "image", "tool_use", "tool_result", "thinking"]
)
# Anything goes: most of these are refused, which both sides must agree on.
_WILD_BLOCKS = st.one_of(
    _TEXT,
    st.fixed_dictionaries(
        {"type": _BLOCK_TYPES},
        optional={
            "text": _TEXT | st.integers(),
            "id": _TEXT,
            "name": _TEXT | st.none(),
            "input": _ARGUMENTS,
            "tool_use_id": _TEXT,
            "content": _JSON,
            "data": _JSON,
        },
    ),
    _JSON,
)
_WILD_TOOL_CALLS = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "id": _TEXT | st.integers(),
            "function": st.fixed_dictionaries(
                {}, optional={"name": _TEXT | st.none(), "arguments": _ARGUMENTS}
            )
            | st.none(),
        },
    )
    | st.none(),
    max_size=3,
)
_WILD_ITEMS = st.fixed_dictionaries(
    {},
    optional={
        "role": _ROLES,
        "type": _TYPES,
        "content": st.none() | _TEXT | st.lists(_WILD_BLOCKS, max_size=3) | st.integers(),
        "tool_calls": _WILD_TOOL_CALLS | _TEXT,
        "tool_call_id": _TEXT,
        "call_id": _TEXT | st.none(),
        "id": _TEXT,
        "name": _TEXT | st.none(),
        "namespace": _TEXT | st.none() | st.integers(),
        "arguments": _ARGUMENTS,
        "output": _JSON,
        "input": _ARGUMENTS,
    },
)
# Items of the three dialects as harnesses send them: most of these hash.
_BLOCKS = st.one_of(
    _TEXT,
    st.fixed_dictionaries({"type": st.sampled_from(["text", "output_text"]), "text": _TEXT}),
    st.fixed_dictionaries({"type": st.just("image"), "source": _JSON}),
    st.fixed_dictionaries(
        {"type": st.just("tool_use"), "id": _TEXT, "name": _TEXT, "input": _ARGUMENTS}
    ),
    st.fixed_dictionaries(
        {"type": st.just("tool_result"), "tool_use_id": _TEXT, "content": _TEXT | _JSON}
    ),
)
_CHAT_CALLS = st.lists(
    st.fixed_dictionaries(
        {"id": _TEXT, "function": st.fixed_dictionaries({"name": _TEXT, "arguments": _ARGUMENTS})}
    ),
    max_size=2,
)
_DIALECT_ITEMS = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["assistant", "user", "system"]), "content": _TEXT},
        optional={"tool_calls": _CHAT_CALLS},
    ),
    st.fixed_dictionaries(
        {"role": st.sampled_from(["assistant", "user"]), "content": st.lists(_BLOCKS, max_size=3)}
    ),
    st.fixed_dictionaries(
        {"role": st.just("tool"), "tool_call_id": _TEXT, "content": _TEXT | _JSON}
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("function_call"),
            "call_id": _TEXT,
            "name": _TEXT,
            "arguments": _ARGUMENTS,
        },
        optional={"namespace": _TEXT | st.none()},
    ),
    st.fixed_dictionaries(
        {"type": st.just("function_call_output"), "call_id": _TEXT, "output": _TEXT | _JSON}
    ),
)
_ITEM_LISTS = st.lists(_DIALECT_ITEMS, max_size=6) | st.lists(
    st.one_of(_DIALECT_ITEMS, _WILD_ITEMS, _JSON), max_size=5
)
_EITHER_ENCODER = settings(max_examples=150)


def _both_encoders(function: Callable[[Any], Any], items: list[Any]) -> list[tuple[str, Any]]:
    """`function(items)` with orjson's canonical JSON, then with the standard library's."""
    with_orjson = _outcome(function, items)
    with mock.patch.object(fingerprint, "_orjson", None):
        with_stdlib = _outcome(function, items)
    return [with_orjson, with_stdlib]


@_EITHER_ENCODER
@given(items=_ITEM_LISTS)
def test_random_items_fingerprint_alike_with_either_encoder(items: list[Any]) -> None:
    """Random items: the assistant fingerprint is the same with or without orjson (or refused)."""
    with_orjson, with_stdlib = _both_encoders(assistant_fingerprint, items)
    assert with_orjson == with_stdlib


@_EITHER_ENCODER
@given(items=_ITEM_LISTS)
def test_random_items_digest_alike_with_either_encoder(items: list[Any]) -> None:
    """Random items: every prefix digest is the same with or without orjson (or refused)."""
    with_orjson, with_stdlib = _both_encoders(context_digests, items)
    assert with_orjson == with_stdlib


# -- the standard-library canonical JSON against orjson ---------------------------------------


def _stdlib(value: Any) -> tuple[str, Any]:
    return _outcome(lambda v: fingerprint._StdlibCanonical().encode(v), value)


def _orjson(value: Any) -> tuple[str, Any]:
    try:
        return "value", orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return "invalid", None


@settings(max_examples=500)
@given(value=_JSON)
def test_stdlib_canonical_json_is_orjson(value: Any) -> None:
    """Random JSON values: the stdlib encoder writes orjson's sorted-key bytes (or both refuse)."""
    assert _stdlib(value) == _orjson(value)


@settings(max_examples=1000)
@given(value=st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True))
def test_stdlib_floats_are_written_as_orjson_writes_them(value: float) -> None:
    """Any float (subnormals, extremes, NaN) is written as orjson writes it."""
    assert _stdlib(value) == _orjson(value)


def test_floats_of_every_exponent_are_written_as_orjson_writes_them() -> None:
    """Floats with each binary exponent and varied mantissas match orjson's bytes."""
    values = [
        struct.unpack(">d", struct.pack(">Q", (exponent << 52) | mantissa))[0]
        for exponent in range(2047)
        for mantissa in (0, 1, 0x8000000000000, 0xFFFFFFFFFFFFF, 0x123456789ABCD)
    ]
    values += [10.0**power for power in range(-30, 31)]
    values += [2.5e-5, 1e-7, 123456.789, 1e15, 1e16, 9007199254740993.0]
    assert all(_stdlib(value) == _orjson(value) for value in values if not math.isnan(value))


@pytest.mark.parametrize("depth", [253, 254, 255, 256])
def test_stdlib_keeps_orjsons_nesting_limit(depth: int) -> None:
    """Nested containers up to orjson's limit are written; one level more is refused by both."""
    lists: Any = []
    mixed: Any = {}
    for level in range(depth - 1):
        lists = [lists]
        mixed = {"k": mixed} if level % 2 else [mixed]
    assert _stdlib(lists) == _orjson(lists)
    assert _stdlib(mixed) == _orjson(mixed)


@pytest.mark.parametrize(
    "value",
    [
        "\ud800",
        {"\udc00": 1},
        {1: "a"},
        {"a": 2**64},
        {"a": -(2**63) - 1},
        [2**64 - 1, -(2**63)],
        b"bytes",
        (1, "two"),
        {"é": "\u2028\x7f\x00\x1f"},
        {"b": 1, "a": {"d": [], "c": {}}, "\U0001f600": 0, "\uffff": 0},
    ],
    ids=[
        "lone-surrogate",
        "surrogate-key",
        "int-key",
        "int-too-large",
        "int-too-small",
        "int-limits",
        "bytes",
        "tuple",
        "escapes",
        "key-order",
    ],
)
def test_stdlib_edge_values_match_orjson(value: Any) -> None:
    """Edge values (surrogates, key types, integer limits, escapes, key order) match orjson."""
    assert _stdlib(value) == _orjson(value)


def test_client_only_install_hashes_the_vectors() -> None:
    """In an interpreter where orjson cannot be imported, the vectors still hash exactly."""
    cases = [
        case
        for case in ITEMS
        if "value" in case["assistant_fingerprint"] and "value" in case["conversation_digest"]
    ]
    probe = (
        "import json, sys; sys.modules['orjson'] = None\n"
        "from token_finalizer_client import _fingerprint, protocol as p\n"
        "cases = json.load(sys.stdin)\n"
        "print(json.dumps([_fingerprint._orjson is None]"
        " + [p.assistant_fingerprint(c['items']) for c in cases]"
        " + [p.conversation_digest(c['items']) for c in cases]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    expected = [True]
    expected += [case["assistant_fingerprint"]["value"] for case in cases]
    expected += [case["conversation_digest"]["value"] for case in cases]
    assert json.loads(result.stdout) == expected
