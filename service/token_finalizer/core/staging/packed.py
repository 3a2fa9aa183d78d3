"""Packed token columns of a stage request and a freeze answer (docs/staging.md#packed-columns).

A staged call of 4,096 tokens with log probabilities is about 117 KB of JSON,
most of it some 12,000 numbers a store would parse one by one and then check
one by one again as it turns them into arrays. The client's sink may send
the three delta columns instead as ``"columns"`` beside ``"record"``: each
the standard base64 of the column's big-endian machine image (token ids
``>u8``, masks and log probabilities ``>f8``). The store decodes each with
numpy in one pass and validates the record exactly as it validates lists.
A float64 image carries every value exactly, so a packed call and the same
call as lists are one record: the same digest and the same stored JSON.

A store answers a finalizer's freeze of a staging rollout in the same form
when asked (`pack_columns`): the finalizer then decodes each snapshot's
columns with numpy instead of parsing some 1,500 numbers per call.
"""

from __future__ import annotations

import binascii
from collections.abc import Mapping
from typing import Any

import numpy as np

from token_finalizer.core.staging._arrays import U64_BE
from token_finalizer.core.staging._wire import StagingRecordError

__all__ = ["PACKED_COLUMNS", "PACK_ERRORS", "pack_columns", "unpack_columns"]

_F64_BE = np.dtype(">f8")
# Each packed column and the machine image it is sent as.
PACKED_COLUMNS: Mapping[str, np.dtype[Any]] = {
    "token_ids_delta": U64_BE,
    "token_mask_delta": _F64_BE,
    "generation_log_probs_delta": _F64_BE,
}
_TYPE = "StagedCallRecord"


def _fail(field: str, problem: str) -> StagingRecordError:
    return StagingRecordError(_TYPE, field, problem)


def unpack_columns(record: object, columns: object, *, native: bool = False) -> dict[str, Any]:
    """``record`` (the wire form without its columns) with ``columns`` decoded into it.

    The arrays are read-only views of the decoded images (``native``: copies
    in the machine's byte order, which orjson's numpy mode writes); the
    record's own validation then checks them as it checks lists. A malformed ``columns``
    (not every packed column, not base64, an image that is not whole
    8-byte values) or a record that also carries a column raises
    ``StagingRecordError``.
    """
    if not isinstance(record, Mapping):
        raise _fail("*", f"must be a JSON object, got {type(record).__name__}")
    if not isinstance(columns, Mapping) or set(columns) != set(PACKED_COLUMNS):
        names = ", ".join(PACKED_COLUMNS)
        raise _fail("columns", f"must be an object of exactly {names}")
    unpacked = dict(record)
    for name, dtype in PACKED_COLUMNS.items():
        if name in unpacked:
            raise _fail(name, "is sent both packed and in the record")
        encoded = columns[name]
        if not isinstance(encoded, str):
            raise _fail(name, "a packed column must be a base64 string")
        try:
            image = binascii.a2b_base64(encoded, strict_mode=True)
        except (binascii.Error, ValueError) as error:
            raise _fail(name, f"the packed column is not base64: {error}") from None
        if len(image) % dtype.itemsize:
            raise _fail(name, f"the packed column is {len(image)} bytes, not whole 8-byte values")
        array = np.frombuffer(image, dtype=dtype)
        unpacked[name] = array.astype(dtype.newbyteorder("=")) if native else array
    return unpacked


def pack_columns(record: Mapping[str, Any]) -> dict[str, Any]:
    """``{"record": <record without its columns>, "columns": {...}}``: the packed form.

    The inverse of `unpack_columns`. One of `PACK_ERRORS` when a column is
    missing or holds a value its image cannot carry exactly: the caller then
    keeps that record as it is.
    """
    rest = dict(record)
    columns = {}
    for name, dtype in PACKED_COLUMNS.items():
        values = np.asarray(rest.pop(name))
        if values.ndim != 1 or values.dtype.kind not in _EXACT_KINDS[dtype.kind]:
            raise ValueError(f"{name} does not pack exactly")
        if values.dtype.kind == "i" and len(values) and int(values.min()) < 0:
            raise ValueError(f"{name} holds a negative id")
        image = values.astype(dtype, copy=False)
        columns[name] = binascii.b2a_base64(image.tobytes(), newline=False).decode("ascii")
    return {"record": rest, "columns": columns}


# What `pack_columns` raises for a record that does not pack: a missing column
# (KeyError), a value numpy cannot take (TypeError), a kind or sign it would not
# carry exactly (ValueError; OverflowError from numpy's integer conversion).
PACK_ERRORS = (ValueError, TypeError, KeyError, OverflowError)
# The array kinds each image carries exactly: ids from integers only (never a
# float), masks and log probabilities from floats or integers (a stored 0 or 1).
_EXACT_KINDS = {"u": "ui", "f": "fiu"}
