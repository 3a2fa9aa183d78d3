"""Token and float columns of staged calls as read-only numpy arrays (docs/staging.md#types).

Token ids are held as big-endian unsigned 64-bit integers (``>u8``): that is
the byte layout every staging hash reads, so hashing a delta, or the whole
linearized sequence, feeds the array's buffer to hashlib without a copy.
Masks and log probabilities are float64, the values the wire carried; the
digest binds them at float32 precision (``float32_be``).

Each converter checks a whole column with numpy; only inputs numpy cannot
hold as a machine array (integers at or beyond 2**63 mixed with negatives,
2**64 and beyond) take an exact per-element path, which exists to name the
offending value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

__all__ = [
    "F32_BE",
    "U64_BE",
    "FloatColumn",
    "TokenColumn",
    "float32_be",
    "float_array",
    "float_view",
    "token_array",
    "token_view",
]

U64_BE = np.dtype(">u8")
F32_BE = np.dtype(">f4")
_ID_LIMIT = 2**64

TokenColumn: TypeAlias = npt.NDArray[np.uint64]
FloatColumn: TypeAlias = npt.NDArray[np.float64]


def _frozen(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    array.flags.writeable = False
    return array


_EMPTY_IDS: TokenColumn = _frozen(np.empty(0, dtype=U64_BE))
_EMPTY_FLOATS: FloatColumn = _frozen(np.empty(0, dtype=np.float64))


def token_array(values: object) -> TokenColumn:
    """``values`` as a read-only ``>u8`` array this module owns (see ``token_view``)."""
    return _owned(token_view(values), values)


def float_array(values: object, *, ints_allowed: bool = True) -> FloatColumn:
    """``values`` as a read-only float64 array this module owns (see ``float_view``)."""
    return _owned(float_view(values, ints_allowed=ints_allowed), values)


def _owned(array: npt.NDArray[Any], source: object) -> npt.NDArray[Any]:
    """``array``, frozen; copied first when it is the caller's own writeable buffer."""
    if array.flags.writeable:
        if isinstance(source, np.ndarray) and np.may_share_memory(array, source):
            array = array.copy()
        array.flags.writeable = False
    return array


def token_view(values: object) -> TokenColumn:
    """``values`` (a list of ints or an integer array) as a contiguous ``>u8`` array.

    An array already in that layout is returned as is (no copy), so hashing
    reads the caller's buffer. Anything that is not an exact integer in
    [0, 2**64) raises ``ValueError``: booleans, floats (even integral ones)
    and strings included.
    """
    if isinstance(values, np.ndarray):
        return _token_ndarray(values)
    if not isinstance(values, list | tuple):
        raise ValueError(f"must be a list of integers, got {type(values).__name__}")
    if not values:
        return _EMPTY_IDS
    array = np.asarray(values)
    kind = array.dtype.kind
    if array.ndim == 1 and kind in "iu":
        # numpy reads [True, 2] as integers: a JSON boolean is not a token id.
        if bool in map(type, values):
            raise ValueError("token ids must be integers, not booleans")
        return _token_ndarray(array)
    if array.ndim == 1 and kind in "fO":
        # Ids at or above 2**63 mixed with smaller ones come out as floats or
        # objects (numpy finds no common integer type): only exact Python ints
        # can say which values they are. Real floats are refused there.
        return _exact_token_array(values)
    raise ValueError(f"must be a flat list of integers (numpy reads it as {array.dtype})")


def _token_ndarray(array: npt.NDArray[Any]) -> TokenColumn:
    if array.ndim != 1:
        raise ValueError(f"must be one-dimensional, got shape {array.shape}")
    kind = array.dtype.kind
    if kind not in "iu":
        raise ValueError(f"must hold integers, got dtype {array.dtype}")
    if array.size == 0:
        return _EMPTY_IDS
    if kind == "i" and int(array.min()) < 0:
        raise ValueError(f"token ids must be non-negative, got {int(array.min())}")
    return np.ascontiguousarray(array.astype(U64_BE, copy=False))


def _exact_token_array(values: Sequence[Any]) -> TokenColumn:
    for value in values:
        if type(value) is not int:
            raise ValueError(f"token ids must be integers, got {type(value).__name__}")
        if not 0 <= value < _ID_LIMIT:
            raise ValueError(f"token ids must lie in [0, 2**64), got {value}")
    return np.array(values, dtype=np.uint64).astype(U64_BE)


def float_view(values: object, *, ints_allowed: bool = True) -> FloatColumn:
    """``values`` (a list of numbers or a float array) as a contiguous float64 array.

    Booleans, strings and non-finite values raise ``ValueError``. Integers are
    taken as floats when ``ints_allowed`` (a JSON ``0`` is ``0.0``), else refused.
    """
    if isinstance(values, np.ndarray):
        return _float_ndarray(values, ints_allowed=ints_allowed)
    if not isinstance(values, list | tuple):
        raise ValueError(f"must be a list of numbers, got {type(values).__name__}")
    if not values:
        return _EMPTY_FLOATS
    unexpected = set(map(type, values)) - ({float, int} if ints_allowed else {float})
    if unexpected:
        names = ", ".join(sorted(kind.__name__ for kind in unexpected))
        raise ValueError(f"must hold floats, got {names}")
    try:
        array = np.asarray(values, dtype=np.float64)
    except OverflowError:
        raise ValueError("holds an integer too large for a float") from None
    return _finite(array)


def _float_ndarray(array: npt.NDArray[Any], *, ints_allowed: bool) -> FloatColumn:
    if array.ndim != 1:
        raise ValueError(f"must be one-dimensional, got shape {array.shape}")
    kind = array.dtype.kind
    if kind != "f" and not (ints_allowed and kind in "iu"):
        raise ValueError(f"must hold floats, got dtype {array.dtype}")
    return _finite(np.ascontiguousarray(array.astype(np.float64, copy=False)))


def _finite(array: FloatColumn) -> FloatColumn:
    finite = np.isfinite(array)
    if not finite.all():
        raise ValueError(f"values must be finite, got {float(array[~finite][0])!r}")
    return array


def float32_be(values: FloatColumn, *, field: str) -> npt.NDArray[np.float32]:
    """The float32 big-endian image of finite ``values``; a value that overflows float32 raises.

    The cast rounds to nearest like ``struct.pack(">f")``, which overflows
    exactly when the rounded value is infinite.
    """
    with np.errstate(over="ignore"):
        narrowed = values.astype(F32_BE)
    if not np.isfinite(narrowed).all():
        bad = float(values[~np.isfinite(narrowed)][0])
        raise ValueError(f"{field} value cannot be represented as float32: {bad!r}")
    return narrowed
