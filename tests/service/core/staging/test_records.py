"""Staged calls and stage results: validation equal to NeMo Gym 0.7.0's, typed columns."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from tests.service.core.staging._calls import staged_call
from tests.service.core.staging._record_cases import cases_of, check_case
from tests.support.staging_core_vectors import load_core_vectors
from token_finalizer.core.staging import (
    EMPTY_EXTRAS_DIGEST,
    StagedCallBaseSnapshot,
    StagedCallRecord,
    StageResult,
    StagingRecordError,
)

GOLDEN = load_core_vectors("golden_vectors.json")


def _golden_record() -> dict[str, Any]:
    return {
        **GOLDEN["staged_call"],
        "digest": GOLDEN["staged_call_digest"],
        "extras": GOLDEN["extras"],
    }


@cases_of("StagedCallBaseSnapshot", "StagedCallRecord", "StageResult")
def test_wire_case_matches_reference(case: dict[str, Any]) -> None:
    """Accepted or refused as the reference does; accepted ones dump identically."""
    check_case(case)


def test_golden_record_round_trips() -> None:
    """The golden staged call reads and writes back unchanged."""
    assert StagedCallRecord.from_json(_golden_record()).to_json() == _golden_record()


def test_columns_are_read_only_arrays() -> None:
    """Token ids are big-endian u64 and no column can be written to."""
    record = StagedCallRecord.from_json(_golden_record())
    assert record.token_ids_delta.dtype == np.dtype(">u8")
    for column in (record.token_ids_delta, record.token_mask_delta):
        with pytest.raises(ValueError, match="read-only"):
            column[0] = 1


def test_constructor_does_not_freeze_the_callers_array() -> None:
    """An array passed in is copied before the record freezes its own."""
    ids = np.array([1, 2], dtype=">u8")
    record = staged_call(prompt=ids, generated=[3])
    ids[0] = 9
    assert record.token_ids_delta.tolist() == [1, 2, 3]


def test_error_names_type_and_field() -> None:
    """A refused value names the type and field it broke."""
    with pytest.raises(StagingRecordError) as caught:
        StagedCallRecord.from_json({**_golden_record(), "weight_version": -1})
    assert (caught.value.type_name, caught.value.field) == ("StagedCallRecord", "weight_version")


def test_digest_mismatch_is_named() -> None:
    """A staged call whose digest does not recompute is refused on the digest field."""
    with pytest.raises(StagingRecordError) as caught:
        StagedCallRecord.from_json({**_golden_record(), "weight_version": 8})
    assert caught.value.field == "digest"


def test_extras_mismatch_is_named() -> None:
    """Extras that do not hash to extras_digest are refused on extras_digest."""
    with pytest.raises(StagingRecordError) as caught:
        StagedCallRecord.from_json({**_golden_record(), "extras": None})
    assert caught.value.field == "extras_digest"


def test_non_object_is_refused() -> None:
    """from_json needs a JSON object."""
    with pytest.raises(StagingRecordError):
        StagedCallBaseSnapshot.from_json([])  # type: ignore[arg-type]


def test_base_snapshot_drops_extras() -> None:
    """A record's base snapshot is the same call without extras."""
    record = StagedCallRecord.from_json(_golden_record())
    base = record.base_snapshot()
    assert type(base) is StagedCallBaseSnapshot
    assert base.to_json() == {k: v for k, v in _golden_record().items() if k != "extras"}


def test_staging_key_property() -> None:
    """A snapshot's staging key is rollout_id/model_call_id."""
    assert StagedCallRecord.from_json(_golden_record()).staging_key == "rollout-1/call-1"


def test_extras_digest_defaults_to_empty() -> None:
    """A record built without extras carries the empty extras digest."""
    record = staged_call()
    assert (record.extras, record.extras_digest) == (None, EMPTY_EXTRAS_DIGEST)


def test_non_finite_log_prob_is_refused() -> None:
    """NaN is not a log probability."""
    data = {**_golden_record(), "generation_log_probs_delta": [0.0, float("nan")]}
    with pytest.raises(StagingRecordError) as caught:
        StagedCallRecord.from_json(data)
    assert caught.value.field == "generation_log_probs_delta"


def test_ids_beyond_int64_are_kept_exactly() -> None:
    """Ids up to 2**64 - 1 survive the round trip exactly."""
    parent = staged_call(prompt=[2**64 - 1, 0, 2**63], generated=[5])
    again = StagedCallRecord.from_json(parent.to_json())
    assert again.token_ids_delta.tolist() == [2**64 - 1, 0, 2**63, 5]


def test_stage_result_round_trips() -> None:
    """A failed stage result writes its wire form."""
    result = StageResult(ok=False, error="parent_not_staged: x")
    assert StageResult.from_json(result.to_json()) == result


def test_records_compare_by_value() -> None:
    """Two reads of one wire form are equal; a record never equals its base snapshot."""
    record = StagedCallRecord.from_json(_golden_record())
    assert record == StagedCallRecord.from_json(_golden_record())
    assert record != record.base_snapshot()
    assert record.base_snapshot() == record.base_snapshot()


def test_records_with_one_field_changed_differ() -> None:
    """Records differing only in a field (here the weight version) are not equal."""
    first, second = staged_call(weight_version=0), staged_call(weight_version=1)
    assert first != second


def test_native_columns_write_the_same_json_as_lists() -> None:
    """orjson writes a record's native columns as the very bytes its lists give."""
    record = StagedCallRecord.from_json(_golden_record())
    native = orjson.dumps(record.to_json(native_columns=True), option=orjson.OPT_SERIALIZE_NUMPY)
    assert native == orjson.dumps(record.to_json())
