"""A staged call's token columns packed at rest, invisible to readers.

A stage request carries the three delta columns as 8-byte images (ids `>u8`,
masks and log probabilities `>f8`): kept like that, a call costs 24 B a delta
token. At rest they are kept instead in their narrowest exact form:

- ids as u32 when every id fits, else u64;
- each float column as f32 when every value round-trips bit for bit (masks are
  0.0/1.0, prompt tokens' log probs 0.0, an engine sampling in float32 reports
  float32 values), else f64;
- each column as its byte planes (every number's first byte, then every
  second byte...), the body zstd-compressed when that is smaller.

A **columns blob** (`pack_columns_blob`) is, little-endian: `COLUMNS_MAGIC`,
flags (1: body compressed), the three widths, the three counts (u64), then
the body. The file store keeps it in a line's `"packed_columns"` (standard
base64) beside the record, which no longer holds the columns.

A **stored base** (`pack_base`, the Redis and memory stores' value) is
`BASE_MAGIC`, the same flags and widths, the three counts and four u32 piece
lengths, then the body: the base snapshot JSON's text cut around its three
arrays (four pieces), then the planes. Expanding it writes the arrays back in
between with orjson (the numbers the stage wrote, byte for byte); a stored
base is kept only when that gives back the base JSON exactly (checked at
stage time), else the JSON itself is stored. Plain JSON values (every value
before 0.5.0) start with `{` and are read as they are.

All of it is numpy in bulk: O(delta) per call, no Python per token.
See docs/staging.md#packed-at-rest.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import zstandard

from token_finalizer._constants import ZSTD_LEVEL
from token_finalizer.core.codec import loads_json

__all__ = [
    "BASE_MAGIC",
    "COLUMNS_MAGIC",
    "COLUMN_NAMES",
    "Columns",
    "PackedError",
    "base_from_stored",
    "columns_of",
    "expand_base",
    "is_packed_base",
    "pack_base",
    "pack_columns_blob",
    "unpack_columns_blob",
]

IDS, MASK, LOG_PROBS = "token_ids_delta", "token_mask_delta", "generation_log_probs_delta"
COLUMN_NAMES = (IDS, MASK, LOG_PROBS)
COLUMNS_MAGIC = b"\x93NGC1"
BASE_MAGIC = b"\x93NGB1"
_COMPRESSED = 1
_COLUMNS_HEADER = struct.Struct("<BBBBQQQ")
_BASE_HEADER = struct.Struct("<BBBBQQQIIII")
# A string orjson writes as itself and no staged field can hold (ids and digests hold no
# control character): where each array goes in the base JSON's text.
_HOLE = "\u0000ng-staged-hole"
_HOLE_TEXT = orjson.dumps(_HOLE)
_NUMPY = orjson.OPT_SERIALIZE_NUMPY


class PackedError(ValueError):
    """A packed value that cannot be read back (torn or not ours)."""


@dataclass(frozen=True, slots=True)
class Columns:
    """A staged call's three delta columns, native-endian (orjson writes those)."""

    ids: npt.NDArray[np.uint64]
    mask: npt.NDArray[np.float64]
    log_probs: npt.NDArray[np.float64]


def columns_of(data: dict[str, Any]) -> Columns:
    """The three columns of a record's JSON form (`to_json(native_columns=True)`)."""
    return Columns(
        np.ascontiguousarray(data[IDS], dtype=np.uint64),
        np.ascontiguousarray(data[MASK], dtype=np.float64),
        np.ascontiguousarray(data[LOG_PROBS], dtype=np.float64),
    )


# -- the planes ---------------------------------------------------------------------------


def _planes(values: npt.NDArray[Any]) -> bytes:
    width = values.dtype.itemsize
    return np.frombuffer(values.tobytes(), dtype=np.uint8).reshape(-1, width).T.tobytes()


def _from_planes(body: bytes, at: int, count: int, dtype: str) -> tuple[npt.NDArray[Any], int]:
    width = np.dtype(dtype).itemsize
    size = count * width
    if at + size > len(body):
        raise PackedError("the packed columns are shorter than their header says")
    planes = np.frombuffer(body, dtype=np.uint8, count=size, offset=at)
    return np.frombuffer(planes.reshape(width, count).T.tobytes(), dtype=dtype), at + size


def _narrow_ids(ids: npt.NDArray[np.uint64]) -> npt.NDArray[Any]:
    if len(ids) and int(ids.max()) >= 2**32:
        return ids.astype("<u8", copy=False)
    return ids.astype("<u4")


def _narrow_floats(values: npt.NDArray[np.float64]) -> npt.NDArray[Any]:
    """f32 when every value comes back bit for bit (-0.0, NaN payloads included), else f64."""
    wide = values.astype("<f8", copy=False)
    with np.errstate(over="ignore", invalid="ignore"):
        narrow = wide.astype("<f4")
    if np.array_equal(narrow.astype("<f8").view("<u8"), wide.view("<u8")):
        return narrow
    return wide


def _body(columns: Columns) -> tuple[tuple[int, int, int], bytes]:
    arrays = (
        _narrow_ids(columns.ids),
        _narrow_floats(columns.mask),
        _narrow_floats(columns.log_probs),
    )
    widths = (arrays[0].itemsize, arrays[1].itemsize, arrays[2].itemsize)
    return widths, b"".join(_planes(array) for array in arrays)


def _squeezed(body: bytes) -> tuple[int, bytes]:
    squeezed = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(body)
    return (_COMPRESSED, squeezed) if len(squeezed) < len(body) else (0, body)


def _opened(flags: int, body: bytes) -> bytes:
    if not flags & _COMPRESSED:
        return body
    try:
        return zstandard.ZstdDecompressor().decompress(body)
    except zstandard.ZstdError as error:
        raise PackedError(f"the packed columns do not decompress: {error}") from None


_ID_TYPES = {4: "<u4", 8: "<u8"}
_FLOAT_TYPES = {4: "<f4", 8: "<f8"}


def _columns_from(
    body: bytes, at: int, widths: tuple[int, int, int], counts: tuple[int, int, int]
) -> tuple[Columns, int]:
    try:
        id_type, mask_type, lp_type = (
            _ID_TYPES[widths[0]],
            _FLOAT_TYPES[widths[1]],
            _FLOAT_TYPES[widths[2]],
        )
    except KeyError:
        raise PackedError(f"unknown column widths {widths}") from None
    ids, at = _from_planes(body, at, counts[0], id_type)
    mask, at = _from_planes(body, at, counts[1], mask_type)
    log_probs, at = _from_planes(body, at, counts[2], lp_type)
    return (
        Columns(
            ids.astype(np.uint64),
            mask.astype(np.float64),
            log_probs.astype(np.float64),
        ),
        at,
    )


# -- the columns blob (the file store's lines) --------------------------------------------


def pack_columns_blob(columns: Columns) -> bytes:
    """The three columns in their narrowest exact form, compressed when smaller."""
    widths, body = _body(columns)
    flags, body = _squeezed(body)
    counts = (len(columns.ids), len(columns.mask), len(columns.log_probs))
    return COLUMNS_MAGIC + _COLUMNS_HEADER.pack(flags, *widths, *counts) + body


def unpack_columns_blob(blob: bytes) -> Columns:
    """The columns of a blob; PackedError when it is not one or is torn."""
    start = len(COLUMNS_MAGIC) + _COLUMNS_HEADER.size
    if not blob.startswith(COLUMNS_MAGIC) or len(blob) < start:
        raise PackedError("not a packed columns blob")
    flags, *rest = _COLUMNS_HEADER.unpack_from(blob, len(COLUMNS_MAGIC))
    body = _opened(flags, blob[start:])
    widths, counts = (rest[0], rest[1], rest[2]), (rest[3], rest[4], rest[5])
    columns, end = _columns_from(body, 0, widths, counts)
    if end != len(body):
        raise PackedError("the packed columns are longer than their header says")
    return columns


# -- the stored base (the Redis and memory stores' value) ---------------------------------


def is_packed_base(stored: bytes) -> bool:
    """Whether a stored base snapshot is packed (else its JSON)."""
    return stored.startswith(BASE_MAGIC)


def pack_base(data: dict[str, Any], base: bytes) -> bytes:
    """The stored form of a base snapshot: packed, or `base` itself when packing is not exact.

    `data` is the base snapshot's JSON form with native columns, `base` its
    JSON (`orjson.dumps(data)`).
    """
    holed = {**data, IDS: _HOLE, MASK: _HOLE, LOG_PROBS: _HOLE}
    pieces = orjson.dumps(holed).split(_HOLE_TEXT)
    if len(pieces) != 4:
        return base
    columns = columns_of(data)
    if _joined(pieces, columns) != base:
        return base
    widths, planes = _body(columns)
    flags, body = _squeezed(b"".join(pieces) + planes)
    counts = (len(columns.ids), len(columns.mask), len(columns.log_probs))
    lengths = tuple(map(len, pieces))
    header = _BASE_HEADER.pack(flags, *widths, *counts, *lengths)
    return BASE_MAGIC + header + body


def _joined(pieces: list[bytes] | tuple[bytes, ...], columns: Columns) -> bytes:
    arrays = (columns.ids, columns.mask, columns.log_probs)
    out = [pieces[0]]
    for array, piece in zip(arrays, pieces[1:], strict=True):
        out += [orjson.dumps(array, option=_NUMPY), piece]
    return b"".join(out)


def _opened_base(stored: bytes) -> tuple[tuple[bytes, ...], Columns]:
    start = len(BASE_MAGIC) + _BASE_HEADER.size
    if len(stored) < start:
        raise PackedError("a stored base shorter than its header")
    flags, *rest = _BASE_HEADER.unpack_from(stored, len(BASE_MAGIC))
    widths, counts, lengths = tuple(rest[0:3]), tuple(rest[3:6]), rest[6:10]
    body = _opened(flags, stored[start:])
    pieces, at = [], 0
    for length in lengths:
        pieces.append(body[at : at + length])
        at += length
    columns, end = _columns_from(body, at, widths, counts)
    if end != len(body):
        raise PackedError("a stored base longer than its header says")
    return tuple(pieces), columns


def expand_base(stored: bytes) -> bytes:
    """The base snapshot JSON of a stored value, byte for byte as staged."""
    if not is_packed_base(stored):
        return stored
    pieces, columns = _opened_base(stored)
    return _joined(pieces, columns)


def base_from_stored(stored: bytes) -> dict[str, Any]:
    """A stored value as the base snapshot's JSON form (columns as native arrays when packed).

    ValueError (PackedError, or the JSON parser's) when it cannot be read.
    """
    if not is_packed_base(stored):
        data = loads_json(stored)
        if not isinstance(data, dict):
            raise PackedError("a stored base snapshot is not a JSON object")
        return data
    pieces, columns = _opened_base(stored)
    data = loads_json(b"[]".join(pieces))
    if not isinstance(data, dict) or not all(name in data for name in COLUMN_NAMES):
        raise PackedError("a stored base's skeleton is not a base snapshot")
    data[IDS], data[MASK], data[LOG_PROBS] = columns.ids, columns.mask, columns.log_probs
    return data
