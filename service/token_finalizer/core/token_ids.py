"""Token id arrays: one dtype rule, and the only places arrays of ids are combined.

Valid ids are the integers in [0, 2**64) (NeMo Gym 0.7 accepts them all).
No numpy integer type holds that range together with anything signed, and
numpy promotes int32 or int64 mixed with uint64 to float64, silently: a
concatenation, a buffer assignment or (before numpy 2) a comparison of such
arrays turns 2**63 + 5 into a rounded float, or wraps it into a negative
number. So every token id array the core holds obeys one rule:

    int32 when every id is below 2**31 (every vocabulary today: half the
    memory of 64 bits), uint64 otherwise; never int64, never a float.

Arrays of one snapshot share one dtype (`uniform_token_arrays` widens them
all when one needs uint64), and the helpers below combine arrays of
different dtypes exactly anyway: ids are non-negative, so casting both sides
to uint64 loses nothing. See docs/records-and-builds.md#token-ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from token_finalizer.core.errors import TokenIdOutOfRange

__all__ = [
    "NARROW",
    "TOKEN_ID_END",
    "WIDE",
    "Ids",
    "buffer_of",
    "check_token_id_list",
    "common_dtype",
    "join_ids",
    "narrowest",
    "out_of_range_message",
    "same_ids",
    "token_id_array",
    "widened",
    "widened_together",
]

Ids: TypeAlias = npt.NDArray[np.integer[Any]]

TOKEN_ID_END = 2**64
NARROW = np.dtype(np.int32)
WIDE = np.dtype(np.uint64)
_NARROW_MAX = int(np.iinfo(np.int32).max)
_EMPTY = np.empty(0, dtype=NARROW)


def out_of_range_message(value: int) -> str:
    """The words NeMo Gym uses for an id the token digest cannot encode."""
    if value < 0:
        return f"token ids must be non-negative, got {value}"
    return f"token ids must be below 2**64, got {value}"


def narrowest(array: Ids) -> Ids:
    """`array` (1-D integers) as int32 when every id fits, else as uint64.

    TokenIdOutOfRange for a negative id in a signed array of another width
    than int32 (int32 arrays are the parsers' own, already checked).
    """
    if array.dtype == NARROW:
        return array
    if not array.size:
        return _EMPTY
    if int(array.max()) <= _NARROW_MAX:
        if array.dtype.kind == "i" and int(array.min()) < 0:
            raise TokenIdOutOfRange(out_of_range_message(int(array.min())))
        return array.astype(NARROW)
    return widened(array)


def widened(array: Ids) -> Ids:
    """`array` as uint64; TokenIdOutOfRange for a negative id (which the cast would wrap)."""
    if array.dtype.kind == "i" and array.size:
        low = int(array.min())
        if low < 0:
            raise TokenIdOutOfRange(out_of_range_message(low))
    return array.astype(WIDE, copy=False)


def token_id_array(value: np.ndarray[Any, Any]) -> Ids:
    """A 1-D integer array of ids in the core's dtype; TokenIdOutOfRange for a negative id.

    TypeError when the array is not one-dimensional integers (booleans are not ids).
    """
    if value.ndim != 1 or value.dtype.kind not in "iu":
        raise TypeError(f"token ids must be a 1-D integer array, got {value.ndim}-D {value.dtype}")
    if value.dtype == NARROW and value.size and int(value.min()) < 0:
        raise TokenIdOutOfRange(out_of_range_message(int(value.min())))
    return narrowest(value)


def check_token_id_list(values: Sequence[Any]) -> Ids:
    """A JSON list of ids as an array in the core's dtype.

    TypeError unless every element is an integer (a JSON boolean is not one);
    TokenIdOutOfRange naming the first bound broken (negative before too large).
    Costs a few C-speed passes over the list, no Python step per id.
    """
    if not values:
        return _EMPTY
    for kind in set(map(type, values)):
        if kind is bool or not issubclass(kind, int | np.integer) or issubclass(kind, np.bool_):
            raise TypeError(f"token ids must be integers, got {kind.__name__}")
    low, high = min(values), max(values)
    if low < 0:
        raise TokenIdOutOfRange(out_of_range_message(int(low)))
    if high >= TOKEN_ID_END:
        raise TokenIdOutOfRange(out_of_range_message(int(high)))
    return np.array(values, dtype=NARROW if high <= _NARROW_MAX else WIDE)


def common_dtype(arrays: Iterable[Ids]) -> np.dtype[Any]:
    """int32 when every array is int32 (or empty), else uint64."""
    for array in arrays:
        if array.dtype != NARROW and array.size:
            return WIDE
    return NARROW


def join_ids(parts: Sequence[Ids]) -> Ids:
    """The concatenation of `parts`, exact whatever their integer dtypes."""
    non_empty = [part for part in parts if len(part)]
    if not non_empty:
        return _EMPTY
    if common_dtype(non_empty) == NARROW:
        return np.concatenate(non_empty)
    return np.concatenate([widened(part) for part in non_empty])


def same_ids(first: Ids, second: Ids) -> bool:
    """Whether two id arrays hold the same ids, exact whatever their integer dtypes."""
    if len(first) != len(second):
        return False
    if _same_memory(first, second):
        # Two views of one buffer (prompts parsed into one buffer, a tape's
        # views): equal without reading them, which keeps checking that each
        # prompt extends the one before from costing O(calls x context).
        return True
    if first.dtype != second.dtype and first.dtype.kind != second.dtype.kind:
        # Mixed signedness: numpy before 2.0 compares through float64. Both
        # sides are non-negative ids, so uint64 holds them exactly.
        return bool(np.array_equal(first.astype(WIDE), second.astype(WIDE)))
    return bool(np.array_equal(first, second))


def _same_memory(first: Ids, second: Ids) -> bool:
    return (
        first.dtype == second.dtype
        and first.strides == second.strides
        and first.ctypes.data == second.ctypes.data
    )


def buffer_of(ids: Ids) -> tuple[Ids, int] | None:
    """The contiguous 1-D array `ids` is a view of (itself if none), and where it starts.

    None when `ids` is not a plain contiguous slice of such an array.
    """
    owner = ids.base if isinstance(ids.base, np.ndarray) else ids
    if (
        owner.ndim != 1
        or owner.dtype != ids.dtype
        or owner.strides != (owner.itemsize,)
        or ids.strides != (ids.itemsize,)
    ):
        return None
    offset, remainder = divmod(ids.ctypes.data - owner.ctypes.data, ids.itemsize)
    if remainder or offset < 0 or offset + len(ids) > len(owner):
        return None
    return owner, offset


def widened_together(arrays: Sequence[Ids]) -> list[Ids]:
    """Every array as uint64; views of one buffer become views of one converted buffer.

    A capture's prompts are views of a few shared buffers: widening each on
    its own would copy O(calls x context) ids. Each buffer is converted once,
    up to the furthest id a view shows (what lies beyond was never written).
    """
    found = [None if array.dtype == WIDE else buffer_of(array) for array in arrays]
    needed: dict[int, tuple[Ids, int]] = {}
    for array, place in zip(arrays, found, strict=True):
        if place is not None:
            owner, offset = place
            end = max(needed.get(id(owner), (owner, 0))[1], offset + len(array))
            needed[id(owner)] = (owner, end)
    converted = {key: widened(owner[:end]) for key, (owner, end) in needed.items()}
    widened_arrays: list[Ids] = []
    for array, place in zip(arrays, found, strict=True):
        if array.dtype == WIDE:
            widened_arrays.append(array)
        elif place is None:
            widened_arrays.append(widened(array))
        else:
            owner, offset = place
            widened_arrays.append(converted[id(owner)][offset : offset + len(array)])
    return widened_arrays
