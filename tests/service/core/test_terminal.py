"""Terminal attribution, checked against NeMo Gym 0.7.0 vectors."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests.support.vectors import case_ids, load_vectors, wire_entry
from token_finalizer.core.terminal import (
    TerminalAttribution,
    attribute_terminal,
    declared_response_id,
    disabled_attribution,
)

CASES = load_vectors("terminal.json")["cases"]

# Absent optional TokenEntry fields, as the wire format defaults them.
_DEFAULTS: dict[str, Any] = {
    "output_items": [],
    "response_id": None,
    "digest": None,
    "cum_len": None,
    "continuation_fingerprint": "",
    "fingerprint_version": None,
}


def _entry(wire: dict[str, Any]) -> SimpleNamespace:
    """A duck-typed entry with int32 token arrays, like the finalizer's TokenEntry."""
    return wire_entry(wire, _DEFAULTS)


def _bare(call_id: str, prompt: list[int], generation: list[int], **extra: Any) -> SimpleNamespace:
    """An entry with only the attributes every entry type has (no lineage fields)."""
    return SimpleNamespace(
        model_call_id=call_id,
        prompt_token_ids=np.array(prompt, dtype=np.int64),
        generation_token_ids=np.array(generation, dtype=np.int64),
        output_items=[],
        **extra,
    )


@pytest.mark.parametrize("case", CASES, ids=case_ids(CASES))
def test_attribution_matches_vector(case: dict[str, Any]) -> None:
    """Method, call id, reason trail and declared flag equal the vector's expectation."""
    result = attribute_terminal([_entry(e) for e in case["entries"]], case["record"])
    expected = case["expected"]
    assert (result.method, result.call_id, result.reason, result.declared) == (
        expected["method"],
        expected["call_id"],
        expected["reason"],
        expected["declared"],
    )


def test_disabled_attribution() -> None:
    """Configured off: method "none", no call, reason "disabled", nothing declared."""
    assert disabled_attribution() == TerminalAttribution("none", None, "disabled", declared=False)


def test_exception_yields_attribution_error() -> None:
    """An entry that breaks attribution yields nothing attributed and reason attribution_error."""
    broken = SimpleNamespace(prompt_token_ids=np.array([1]))  # no model_call_id
    result = attribute_terminal([broken], {"_ng_terminal_model_call_id": "c1"})
    assert (result.method, result.call_id, result.reason) == ("none", None, "attribution_error")


def test_attribution_error_keeps_the_declared_flag() -> None:
    """A declared response id still counts as declared when attribution itself fails."""
    broken = SimpleNamespace(prompt_token_ids=np.array([1]), response_id="resp-1")
    result = attribute_terminal([broken], {"terminal_response_id": "resp-1"})
    assert (result.reason, result.declared) == ("attribution_error", True)


def test_record_that_is_not_a_mapping_yields_attribution_error() -> None:
    """A malformed record never raises out of attribution."""
    result = attribute_terminal([], "not a record")  # type: ignore[arg-type]  # hostile on purpose
    assert (result.reason, result.declared, result.attributed) == (
        "attribution_error",
        False,
        False,
    )


def test_entries_without_lineage_fields_are_attributable() -> None:
    """Entry types lacking the 0.7 fields are read as if those fields were absent."""
    entries = [_bare("c1", [1], [2]), _bare("c2", [1, 2, 3], [4])]
    result = attribute_terminal(entries, {"_ng_terminal_model_call_id": "c2"})
    assert (result.method, result.call_id) == ("explicit", "c2")


def test_token_identity_ignores_array_dtype() -> None:
    """Identical token sequences collapse even when stored with different integer dtypes."""
    a = _bare("a", [1, 2], [3], response_id="r")
    b = SimpleNamespace(
        model_call_id="b",
        prompt_token_ids=np.array([1, 2], dtype=np.int32),
        generation_token_ids=np.array([3], dtype=np.int32),
        output_items=[],
        response_id="r",
    )
    result = attribute_terminal([b, a], {"response": {"id": "r"}})
    assert (result.method, result.call_id) == ("response_id", "a")


def test_same_tokens_split_differently_do_not_collapse() -> None:
    """Identity compares prompt and generation separately, not their concatenation."""
    a = _bare("a", [1, 2], [3], response_id="r")
    b = _bare("b", [1], [2, 3], response_id="r")
    result = attribute_terminal([a, b], {"response": {"id": "r"}})
    assert result.reason == "response_id_ambiguous,response_has_no_output"


def test_declared_response_id_reads_falsy_as_absent() -> None:
    """null, "", 0 and false declare nothing; other values are taken as str(value)."""
    assert [
        declared_response_id({"terminal_response_id": v}) for v in (None, "", 0, False, 12)
    ] == [
        None,
        None,
        None,
        None,
        "12",
    ]


def test_attributed_property_follows_call_id() -> None:
    """A result is attributed exactly when it names a call."""
    assert TerminalAttribution("explicit", "c", "", declared=False).attributed
    assert not TerminalAttribution("none", None, "no_response_object", declared=False).attributed


def test_lineage_fields_are_read_from_a_nested_lineage_record() -> None:
    """An entry keeping its 0.7 fields on ``entry.lineage`` is read like a flat one."""
    entry = _bare("c1", [1], [2], lineage=SimpleNamespace(response_id="resp-1"))
    result = attribute_terminal([entry], {"response": {"id": "resp-1"}})
    assert (result.method, result.call_id) == ("response_id", "c1")
