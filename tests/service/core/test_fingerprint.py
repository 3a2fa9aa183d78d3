"""Fingerprints v2, bit-exact with NeMo Gym 0.7.0 vectors."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.vectors import case_ids, load_vectors
from token_finalizer.core.fingerprint import (
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


def _check(function: Any, argument: Any, expected: dict[str, Any]) -> None:
    if "error" in expected:
        with pytest.raises(FingerprintError):
            function(argument)
    else:
        assert function(argument) == expected["value"]


@pytest.mark.parametrize("case", ARGUMENTS, ids=case_ids(ARGUMENTS))
def test_canonical_arguments_match_reference(case: dict[str, Any]) -> None:
    """Tool-call arguments canonicalize exactly as the reference does, or are invalid."""
    _check(canonical_arguments, case["value"], case)


@pytest.mark.parametrize("case", ITEMS, ids=case_ids(ITEMS))
def test_assistant_fingerprint_matches_reference(case: dict[str, Any]) -> None:
    """assistant_fingerprint equals the reference hex (or "" / invalid input)."""
    _check(assistant_fingerprint, case["items"], case["assistant_fingerprint"])


@pytest.mark.parametrize("case", ITEMS, ids=case_ids(ITEMS))
def test_conversation_digest_matches_reference(case: dict[str, Any]) -> None:
    """conversation_digest equals the reference hex, or the input is invalid."""
    _check(conversation_digest, case["items"], case["conversation_digest"])


@pytest.mark.parametrize("case", VALID_ITEMS, ids=case_ids(VALID_ITEMS))
def test_context_digests_are_the_prefix_digests(case: dict[str, Any]) -> None:
    """context_digests(items)[k] == conversation_digest(items[:k]) for every k."""
    items = case["items"] or []
    expected = [conversation_digest(items[:k]) for k in range(len(items) + 1)]
    assert context_digests(items) == expected
    assert expected[-1] == case["conversation_digest"]["value"]


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


def test_canonical_json_sorts_keys_compactly() -> None:
    """canonical_json writes sorted keys, no spaces, raw UTF-8, NaN as null."""
    value = {"b": [1.0, float("nan")], "a": "é"}
    assert canonical_json(value) == '{"a":"é","b":[1.0,null]}'.encode()


def test_canonical_json_refuses_ints_beyond_uint64() -> None:
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
