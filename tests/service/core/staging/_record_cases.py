"""Shared reading of core_records.json: each case's type, input and expected outcome."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.staging_core_vectors import case_ids, load_core_vectors
from token_finalizer.core.staging import (
    CallRecord,
    ManifestFailure,
    RolloutManifest,
    RolloutReceipt,
    StagedCallBaseSnapshot,
    StagedCallRecord,
    StageResult,
    StagingRecordError,
)

TYPES: dict[str, Any] = {
    "StagedCallBaseSnapshot": StagedCallBaseSnapshot,
    "StagedCallRecord": StagedCallRecord,
    "StageResult": StageResult,
    "CallRecord": CallRecord,
    "ManifestFailure": ManifestFailure,
    "RolloutManifest": RolloutManifest,
    "RolloutReceipt": RolloutReceipt,
}
CASES = load_core_vectors("core_records.json")["cases"]


def cases_of(*type_names: str) -> Any:
    """A pytest parametrization over the cases of the given types."""
    selected = [case for case in CASES if case["type"] in type_names]
    return pytest.mark.parametrize("case", selected, ids=case_ids(selected))


def check_case(case: dict[str, Any]) -> None:
    """Valid inputs dump to the reference's JSON; invalid ones raise StagingRecordError."""
    kind = TYPES[case["type"]]
    if case["expected"]["valid"]:
        assert kind.from_json(case["input"]).to_json() == case["expected"]["json"]
    else:
        with pytest.raises(StagingRecordError):
            kind.from_json(case["input"])
