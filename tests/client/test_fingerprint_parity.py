"""The client's fingerprints are the service's, bit for bit, with orjson and without it.

`token_finalizer_client._fingerprint` cannot import the service, so it carries
its own implementation; these tests run it and the service's
`token_finalizer.core.fingerprint` over the committed NeMo Gym 0.7 vectors and
over random item lists. Each runs twice: with orjson (the client's `fast`
extra) and with the standard-library canonical JSON a client-only install
uses, which is also compared with orjson directly.
"""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.vectors import case_ids, load_vectors
from token_finalizer.core import fingerprint as server
from token_finalizer_client import _fingerprint as client

VECTORS = load_vectors("fingerprints.json")
ARGUMENTS = VECTORS["canonical_arguments"]
ITEMS = VECTORS["items"]


@pytest.fixture(params=["orjson", "stdlib"])
def canonical(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The client's canonical JSON by orjson, then by the standard library alone."""
    assert client._orjson is not None, "orjson is a test dependency (via the service)"
    if request.param == "stdlib":
        monkeypatch.setattr(client, "_orjson", None)
    return str(request.param)


def _outcome(function: Callable[[Any], Any], argument: Any) -> tuple[str, Any]:
    """("value", result), or ("invalid", None) when the input is refused as not fingerprintable."""
    try:
        return "value", function(argument)
    except ValueError:
        return "invalid", None


def _expected(case: dict[str, Any]) -> tuple[str, Any]:
    return ("invalid", None) if "error" in case else ("value", case["value"])


# -- the committed vectors ---------------------------------------------------------------------


@pytest.mark.parametrize("case", ITEMS, ids=case_ids(ITEMS))
def test_assistant_fingerprint_matches_the_vector(canonical: str, case: dict[str, Any]) -> None:
    """The client's assistant_fingerprint is the vector's (and the service's), or both refuse."""
    expected = _expected(case["assistant_fingerprint"])
    assert _outcome(client.assistant_fingerprint, case["items"]) == expected
    assert _outcome(server.assistant_fingerprint, case["items"]) == expected


@pytest.mark.parametrize("case", ITEMS, ids=case_ids(ITEMS))
def test_conversation_digest_matches_the_vector(canonical: str, case: dict[str, Any]) -> None:
    """The client's conversation_digest is the vector's (and the service's), or both refuse."""
    expected = _expected(case["conversation_digest"])
    assert _outcome(client.conversation_digest, case["items"]) == expected
    assert _outcome(server.conversation_digest, case["items"]) == expected


@pytest.mark.parametrize("case", ITEMS, ids=case_ids(ITEMS))
def test_context_digests_match_the_service(canonical: str, case: dict[str, Any]) -> None:
    """context_digests of every vector's items equal the service's (or both refuse)."""
    items = case["items"] or []
    assert _outcome(client.context_digests, items) == _outcome(server.context_digests, items)


@pytest.mark.parametrize("case", ARGUMENTS, ids=case_ids(ARGUMENTS))
def test_tool_arguments_canonicalize_as_the_vector(canonical: str, case: dict[str, Any]) -> None:
    """Tool-call arguments canonicalize to the vector's text, or are refused as it says."""
    expected = _expected(case)
    decoded = _outcome(lambda value: client._arguments(value).decode("utf-8"), case["value"])
    assert decoded == expected


def test_resolution_vectors_hash_the_same(canonical: str) -> None:
    """The wire form of every resolution vector is what the client computes from its items."""
    for case in load_vectors("resolution.json")["cases"]:
        if case["request"] is None:
            continue
        items = case["request_items"]
        assert client.assistant_fingerprint(items) == case["request"]["fingerprint"]
        assert client.context_digests(items) == case["request"]["context_digests"]


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
_PARITY = settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_PARITY
@given(items=_ITEM_LISTS)
def test_random_items_fingerprint_as_the_service(canonical: str, items: list[Any]) -> None:
    """Random items: the client's assistant fingerprint equals the service's (or both refuse)."""
    assert _outcome(client.assistant_fingerprint, items) == _outcome(
        server.assistant_fingerprint, items
    )


@_PARITY
@given(items=_ITEM_LISTS)
def test_random_items_digest_as_the_service(canonical: str, items: list[Any]) -> None:
    """Random items: every prefix digest of the client equals the service's (or both refuse)."""
    assert _outcome(client.context_digests, items) == _outcome(server.context_digests, items)


# -- the standard-library canonical JSON against orjson ---------------------------------------


def _stdlib(value: Any) -> tuple[str, Any]:
    return _outcome(lambda v: client._StdlibCanonical().encode(v), value)


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
        "from token_finalizer_client import _fingerprint as f\n"
        "cases = json.load(sys.stdin)\n"
        "print(json.dumps([f._orjson is None]"
        " + [f.assistant_fingerprint(c['items']) for c in cases]"
        " + [f.conversation_digest(c['items']) for c in cases]))"
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
