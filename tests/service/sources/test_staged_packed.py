"""The packed forms of a staged call's columns (sources/_staged_packed.py).

docs/staging.md#packed-at-rest: ids u32 when all fit else u64, each float
column f32 only when every value comes back bit for bit, zstd when smaller;
a stored base expands to the base JSON exactly; a plain JSON value passes
through; a torn value is a PackedError.
"""

from __future__ import annotations

import struct

import numpy as np
import orjson
import pytest

from tests.support.staging_stores import Conversation
from token_finalizer.core.staging import StagedCallBaseSnapshot
from token_finalizer.sources._staged_packed import (
    BASE_MAGIC,
    COLUMNS_MAGIC,
    Columns,
    PackedError,
    base_from_stored,
    columns_of,
    expand_base,
    pack_base,
    pack_columns_blob,
    unpack_columns_blob,
)
from token_finalizer.sources._staging import base_json


def _columns(ids: list[int], mask: list[float], log_probs: list[float]) -> Columns:
    return Columns(
        np.array(ids, dtype=np.uint64),
        np.array(mask, dtype=np.float64),
        np.array(log_probs, dtype=np.float64),
    )


def _widths(blob: bytes) -> tuple[int, int, int]:
    _, ids, mask, log_probs = struct.unpack_from("<BBBB", blob, len(COLUMNS_MAGIC))
    return ids, mask, log_probs


def _same(first: Columns, second: Columns) -> bool:
    pairs = zip(
        (first.ids, first.mask, first.log_probs),
        (second.ids, second.mask, second.log_probs),
        strict=True,
    )
    return all(a.dtype == b.dtype and a.tobytes() == b.tobytes() for a, b in pairs)


SHAPES = {
    "small ids, f32 values": _columns([1, 2, 150_000], [0.0, 1.0, 1.0], [0.0, -0.5, -0.25]),
    "ids at 2**32": _columns([2**32, 5], [0.0, 1.0], [0.0, -1.5]),
    "ids past 2**63": _columns([2**63 + 7, 2**64 - 1], [1.0, 1.0], [-0.5, -0.125]),
    "f64-only log probs": _columns([3, 4], [0.0, 1.0], [-0.1, -1 / 3]),
    "a subnormal double": _columns([3], [1.0], [-2.5e-300]),
    "negative zero and NaN": _columns([3, 4], [-0.0, 1.0], [-0.0, float("nan")]),
    "one token": _columns([7], [1.0], [-0.75]),
    "empty": _columns([], [], []),
}


@pytest.mark.parametrize("name", SHAPES)
def test_every_column_shape_comes_back_bit_for_bit(name: str) -> None:
    """Unpacked, a blob gives each column's values, dtype and bytes back exactly."""
    columns = SHAPES[name]
    assert _same(unpack_columns_blob(pack_columns_blob(columns)), columns)


def test_ids_are_u32_when_all_fit_and_u64_otherwise() -> None:
    """The id width follows the largest id: 4 bytes below 2**32, 8 from it."""
    widths = [_widths(pack_columns_blob(SHAPES[name]))[0] for name in ("empty", "ids at 2**32")]
    assert widths == [4, 8]


def test_floats_narrow_only_when_every_value_round_trips() -> None:
    """Masks and f32-exact log probs take 4 bytes; one inexact value keeps the column at 8."""
    assert _widths(pack_columns_blob(SHAPES["small ids, f32 values"]))[1:] == (4, 4)
    assert _widths(pack_columns_blob(SHAPES["f64-only log probs"]))[1:] == (4, 8)
    assert _widths(pack_columns_blob(SHAPES["a subnormal double"]))[2] == 8


def test_a_long_column_is_compressed_far_below_its_8_byte_images() -> None:
    """4,000 small ids, a 0/1 mask and zero log probs pack below 3 bytes a token."""
    count = 4_000
    ids = np.random.default_rng(1).integers(0, 150_000, count).tolist()
    columns = _columns(ids, [1.0] * count, [0.0] * count)
    assert len(pack_columns_blob(columns)) < 3 * count


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"{}",
        COLUMNS_MAGIC + b"\x00",
        COLUMNS_MAGIC + struct.pack("<BBBBQQQ", 0, 4, 4, 4, 9, 0, 0),
    ],
    ids=["empty", "json", "short header", "short body"],
)
def test_a_torn_blob_is_a_packed_error(blob: bytes) -> None:
    """Anything that is not a whole blob raises PackedError, never a wrong column."""
    with pytest.raises(PackedError):
        unpack_columns_blob(blob)


def _base(index: int = 0) -> tuple[dict[str, object], bytes]:
    chat = Conversation.of("packed-base", index + 1)
    record = chat.records[index]
    return StagedCallBaseSnapshot.to_json(record, native_columns=True), base_json(record)


def test_a_stored_base_expands_to_the_base_json_byte_for_byte() -> None:
    """A packed base gives back exactly the JSON it was made from."""
    data, base = _base(2)
    stored = pack_base(data, base)
    assert (stored.startswith(BASE_MAGIC), expand_base(stored)) == (True, base)


def test_a_stored_base_reads_back_as_the_snapshot() -> None:
    """Read back, a packed base is the base snapshot's JSON form, columns as arrays."""
    data, base = _base(1)
    read = base_from_stored(pack_base(data, base))
    assert StagedCallBaseSnapshot.from_json(read) == StagedCallBaseSnapshot.from_json(data)


def test_a_base_json_value_is_read_as_it_is() -> None:
    """A value stored before packing (the base JSON) expands to itself and parses."""
    data, base = _base(0)
    assert (expand_base(base), base_from_stored(base)["digest"]) == (base, data["digest"])


def test_a_base_that_would_not_come_back_exactly_is_kept_as_json() -> None:
    """When the pieces would not rebuild `base` (here: another JSON), the JSON is stored."""
    data, _ = _base(0)
    other = orjson.dumps({**data, "mode": "other"}, option=orjson.OPT_SERIALIZE_NUMPY)
    assert pack_base(data, other) == other


def test_a_torn_stored_base_is_a_packed_error() -> None:
    """A packed base cut short raises PackedError."""
    data, base = _base(0)
    stored = pack_base(data, base)
    with pytest.raises(PackedError):
        expand_base(stored[: len(stored) // 2])


def test_columns_of_reads_a_records_native_columns() -> None:
    """`columns_of` takes the three arrays of a record's JSON form as they are."""
    data, _ = _base(0)
    columns = columns_of(data)
    assert columns.ids.tolist() == list(data["token_ids_delta"])
