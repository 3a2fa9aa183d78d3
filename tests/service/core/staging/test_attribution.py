"""Terminal attribution over manifest rows and the parent-link walk, against NeMo Gym 0.7.0."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.staging_core_vectors import case_ids, load_core_vectors
from token_finalizer.core.staging import CallRecord, attribute_rows, select_terminal_call

VECTORS = load_core_vectors("core_terminal.json")
SELECTION = VECTORS["selection"]
ATTRIBUTION = VECTORS["attribution"]


def _rows(case: dict[str, Any]) -> list[CallRecord]:
    return [CallRecord.from_json(row) for row in case["records"]]


@pytest.mark.parametrize("case", SELECTION, ids=case_ids(SELECTION))
def test_walk_matches_reference(case: dict[str, Any]) -> None:
    """The parent-link walk picks the reference's call, or fails with its reason."""
    selection = select_terminal_call(_rows(case))
    assert {"call_id": selection.call_id, "reason": selection.reason} == case["expected"]


@pytest.mark.parametrize("case", ATTRIBUTION, ids=case_ids(ATTRIBUTION))
def test_attribution_matches_reference(case: dict[str, Any]) -> None:
    """Witnesses name the reference's call, with its method and reason trail."""
    attribution = attribute_rows(_rows(case), case["record"])
    expected = case["expected"]
    assert attribution.call_id == expected["call_id"]
    assert attribution.method == (expected["method"] or "none")
    assert attribution.reason == expected["reason"]


def test_declared_failure_is_named() -> None:
    """A declared id without a row says so in failure, and marks the record declared."""
    case = next(case for case in ATTRIBUTION if case["name"] == "declared_missing")
    attribution = attribute_rows(_rows(case), case["record"])
    assert (attribution.declared, attribution.failure) == (True, "declared_terminal_not_captured")


def test_disagreement_failure_is_named() -> None:
    """Witnesses naming different sequences give failure witness_disagreement."""
    case = next(case for case in ATTRIBUTION if case["name"] == "disagreement")
    assert attribute_rows(_rows(case), case["record"]).failure == "witness_disagreement"


def test_no_witness_failure_is_named() -> None:
    """Nothing to attribute by gives failure no_witness."""
    case = next(case for case in ATTRIBUTION if case["name"] == "no_response")
    assert attribute_rows(_rows(case), case["record"]).failure == "no_witness"


def test_empty_response_object_counts_as_none() -> None:
    """An empty response object is no response (docs/staging.md#receipt-policy)."""
    case = ATTRIBUTION[0]
    attribution = attribute_rows(_rows(case), {"response": {}})
    assert attribution.reason == "no_response_object"


@pytest.mark.parametrize("claim", [0, False, ""])
def test_falsy_claims_are_not_given(claim: Any) -> None:
    """A falsy declared id counts as not declared."""
    case = ATTRIBUTION[0]
    assert not attribute_rows(_rows(case), {"terminal_response_id": claim}).declared


def test_attribution_never_raises() -> None:
    """A record that breaks attribution yields attribution_error, not an exception."""

    class Broken(dict[str, Any]):
        def get(self, key: str, default: Any = None) -> Any:
            if key == "response":
                raise RuntimeError("boom")
            return super().get(key, default)

    attribution = attribute_rows(_rows(ATTRIBUTION[0]), Broken())
    assert (attribution.call_id, attribution.failure) == (None, "attribution_error")
