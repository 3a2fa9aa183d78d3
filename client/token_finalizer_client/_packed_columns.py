"""A staged call's token columns packed as binary images (docs/staging.md#packed-columns).

A 4,096-token call is about 117 KB of JSON, nearly all of it the three delta
columns, which the store would parse and check number by number. The sink
sends them instead beside the record as

    "columns": {"token_ids_delta": "<base64 of >u8>",
                "token_mask_delta": "<base64 of >f8>",
                "generation_log_probs_delta": "<base64 of >f8>"}

built by `array` and `binascii` in C, no Python per token. Float64 images
hold every value exactly: the store reads the same record either way.
Only columns of exactly the JSON types the store keeps as they are pack
(ids all `int` in [0, 2**64), masks and log probabilities all `float`); any
other column (empty, holding ints among floats, a boolean, a string, ids out
of range) leaves the record as lists, so the store's own validation judges
it and names what is wrong, exactly as before.
"""

from __future__ import annotations

import array
import binascii
import sys
from collections.abc import Sequence
from typing import Any, TypeGuard

__all__ = ["COLUMN_NAMES", "pack_columns"]

IDS, MASK, LOG_PROBS = "token_ids_delta", "token_mask_delta", "generation_log_probs_delta"
COLUMN_NAMES = (IDS, MASK, LOG_PROBS)
_U64 = next(code for code in ("L", "Q") if array.array(code).itemsize == 8)
_BIG_ENDIAN = sys.byteorder == "big"


def _all_of(values: object, kind: type) -> TypeGuard[list[Any] | tuple[Any, ...]]:
    return isinstance(values, list | tuple) and bool(values) and set(map(type, values)) == {kind}


def _image(values: Sequence[int] | Sequence[float], typecode: str) -> str:
    packed = array.array(typecode, values)
    if not _BIG_ENDIAN:
        packed.byteswap()
    return binascii.b2a_base64(packed, newline=False).decode("ascii")


def pack_columns(ids: object, mask: object, log_probs: object) -> dict[str, str] | None:
    """The three columns' packed images, or None when any of them does not pack exactly."""
    if not (_all_of(ids, int) and _all_of(mask, float) and _all_of(log_probs, float)):
        return None
    try:
        packed_ids = _image(ids, _U64)
    except OverflowError:  # an id below 0 or at 2**64 and beyond: the store names it
        return None
    return {IDS: packed_ids, MASK: _image(mask, "d"), LOG_PROBS: _image(log_probs, "d")}
