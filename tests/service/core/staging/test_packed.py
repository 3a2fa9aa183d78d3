"""Packed token columns of a stage request: decoded into the same record as lists give."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest

from tests.support.staging_stores import Conversation
from token_finalizer.core.staging import (
    PACKED_COLUMNS,
    StagedCallRecord,
    StagingRecordError,
    pack_columns,
    unpack_columns,
)


def _record() -> dict[str, Any]:
    return Conversation.of("r-packed", 2).records[1].to_json()


def _packed(record: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    columns = {
        name: base64.b64encode(np.asarray(record[name], dtype=dtype).tobytes()).decode()
        for name, dtype in PACKED_COLUMNS.items()
    }
    rest = {key: value for key, value in record.items() if key not in PACKED_COLUMNS}
    return rest, columns


def test_packed_columns_read_as_the_record_the_lists_give() -> None:
    """A record sent packed reads equal to the same record sent as lists."""
    record = _record()
    unpacked = StagedCallRecord.from_json(unpack_columns(*_packed(record)))
    assert unpacked == StagedCallRecord.from_json(record)


def test_a_packed_record_writes_back_the_same_json() -> None:
    """The unpacked record's wire form is the lists' (the stored JSON is the same)."""
    record = _record()
    assert StagedCallRecord.from_json(unpack_columns(*_packed(record))).to_json() == record


def test_a_missing_packed_column_is_refused() -> None:
    """columns must hold all three columns."""
    rest, columns = _packed(_record())
    del columns["token_mask_delta"]
    with pytest.raises(StagingRecordError, match="columns"):
        unpack_columns(rest, columns)


def test_a_column_sent_twice_is_refused() -> None:
    """A column both packed and in the record is refused, never silently chosen."""
    record = _record()
    _, columns = _packed(record)
    with pytest.raises(StagingRecordError, match="both packed and in the record"):
        unpack_columns(record, columns)


def test_a_column_that_is_not_base64_is_refused() -> None:
    """A packed column must be strict base64."""
    rest, columns = _packed(_record())
    columns["token_ids_delta"] = "not base64!"
    with pytest.raises(StagingRecordError, match="not base64"):
        unpack_columns(rest, columns)


def test_a_column_of_partial_values_is_refused() -> None:
    """A packed image must hold whole 8-byte values."""
    rest, columns = _packed(_record())
    columns["generation_log_probs_delta"] = base64.b64encode(b"\x00" * 12).decode()
    with pytest.raises(StagingRecordError, match="not whole 8-byte values"):
        unpack_columns(rest, columns)


def test_a_non_finite_packed_value_is_refused_by_the_record() -> None:
    """A NaN log probability packed is refused by the record's own validation."""
    rest, columns = _packed(_record())
    values = np.frombuffer(base64.b64decode(columns["generation_log_probs_delta"]), ">f8").copy()
    values[0] = np.nan
    columns["generation_log_probs_delta"] = base64.b64encode(values.tobytes()).decode()
    with pytest.raises(StagingRecordError, match="finite"):
        StagedCallRecord.from_json(unpack_columns(rest, columns))


def test_pack_columns_is_the_inverse_of_unpack_columns() -> None:
    """A record packed for a freeze answer unpacks into the record it was."""
    record = _record()
    packed = pack_columns(record)
    assert set(packed) == {"record", "columns"} and set(packed["columns"]) == set(PACKED_COLUMNS)
    unpacked = unpack_columns(packed["record"], packed["columns"])
    assert StagedCallRecord.from_json(unpacked) == StagedCallRecord.from_json(record)


def test_integer_masks_pack_as_exact_floats() -> None:
    """A stored mask of 0 and 1 integers packs as the float64 image of 0.0 and 1.0."""
    record = {**_record(), "token_mask_delta": [0, 1, 1]}
    image = base64.b64decode(pack_columns(record)["columns"]["token_mask_delta"])
    assert np.frombuffer(image, dtype=">f8").tolist() == [0.0, 1.0, 1.0]


@pytest.mark.parametrize(
    ("column", "values"),
    [
        ("token_ids_delta", [1.0, 2.0]),
        ("token_ids_delta", [-1, 2]),
        ("token_ids_delta", [[1], [2]]),
        ("token_ids_delta", [1, "2"]),
        ("generation_log_probs_delta", ["x"]),
    ],
    ids=["float-ids", "negative-id", "nested", "text-id", "text-log-prob"],
)
def test_a_column_that_would_not_pack_exactly_is_refused(column: str, values: list[Any]) -> None:
    """Floats as ids, negative ids, nesting or text: ValueError, never a wrapped value."""
    with pytest.raises(ValueError, match=r"pack exactly|negative id"):
        pack_columns({**_record(), column: values})


def test_a_record_without_a_column_is_refused() -> None:
    """Every packed column must be there."""
    record = _record()
    del record["token_mask_delta"]
    with pytest.raises(KeyError):
        pack_columns(record)
