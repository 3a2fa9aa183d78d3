"""Manifest rows, failures, manifests and receipts: validation equal to NeMo Gym 0.7.0's."""

from __future__ import annotations

from typing import Any

import pytest

from tests.service.core.staging._record_cases import CASES, cases_of, check_case
from token_finalizer.core.staging import (
    CallRecord,
    ManifestFailure,
    RolloutManifest,
    RolloutReceipt,
    StagingRecordError,
)

ROW = next(case["input"] for case in CASES if case["name"] == "call_record_valid")
RECEIPT = next(case["input"] for case in CASES if case["name"] == "receipt_valid")


@cases_of("CallRecord", "ManifestFailure", "RolloutManifest", "RolloutReceipt")
def test_wire_case_matches_reference(case: dict[str, Any]) -> None:
    """Accepted or refused as the reference does; accepted ones dump identically."""
    check_case(case)


def test_call_record_is_hashable_and_comparable() -> None:
    """Rows are frozen values: equal when their fields are."""
    assert CallRecord.from_json(ROW) == CallRecord.from_json(dict(ROW))
    assert len({CallRecord.from_json(ROW), CallRecord.from_json(ROW)}) == 1


def test_manifest_accepts_typed_rows() -> None:
    """A manifest may be built from typed rows and failures."""
    manifest = RolloutManifest(
        rollout_id="r",
        records=(CallRecord.from_json(ROW),),
        failures=(ManifestFailure(model_call_id="x", reason="unresolved_parent"),),
    )
    assert RolloutManifest.from_json(manifest.to_json()) == manifest


def test_manifest_refuses_non_object_rows() -> None:
    """Rows must be objects."""
    with pytest.raises(StagingRecordError) as caught:
        RolloutManifest.from_json({"rollout_id": "r", "records": ["a"]})
    assert caught.value.field == "records"


def test_receipt_keeps_its_wire_key_order() -> None:
    """to_json writes the reference's field order."""
    assert list(RolloutReceipt.from_json(RECEIPT).to_json()) == list(RECEIPT)


def test_receipt_terminal_must_be_in_manifest() -> None:
    """A terminal absent from the manifest is refused on that field."""
    with pytest.raises(StagingRecordError) as caught:
        RolloutReceipt.from_json({**RECEIPT, "terminal_model_call_id": "elsewhere"})
    assert caught.value.field == "terminal_model_call_id"


def test_poisoned_receipt_may_name_a_terminal() -> None:
    """Attribution can succeed before another call poisons the rollout."""
    data = {**RECEIPT, "capture_poisoned": True, "failure_reason": "unresolved_parent"}
    receipt = RolloutReceipt.from_json(data)
    assert (receipt.terminal_model_call_id, receipt.failure_reason) == ("b", "unresolved_parent")
