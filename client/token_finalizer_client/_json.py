"""JSON both ways: orjson when it is installed, the standard library otherwise.

orjson encodes a request and parses an answer many times faster (a put of a
25,000-token entry: about 20x), but it is an optional extra
(`token-finalizer-client[fast]`), so the package works without it. Both
paths agree:

- Encoding: the standard library is run with orjson's layout (no spaces,
  UTF-8 instead of `\\u` escapes), so a payload without floats encodes to the
  same bytes either way, and a float to the same value. orjson cannot write
  what the standard library writes for `NaN` and infinities (it writes
  `null`, which would turn a `-inf` log probability into a missing one), nor
  integers beyond 64 bits, nor non-string keys: such payloads are encoded by
  the standard library. Finding a non-finite float costs a `sum()` per list
  of numbers, in C, and only when orjson's output holds a `null` at all.
- Decoding: orjson refuses `NaN` and `-Infinity` (which Python writers put
  in log probabilities), and it reads an integer beyond 64 bits as a float,
  silently losing digits: a body that refuses, or that holds a run of 20
  digits or more (found without parsing, in C) that is not a fraction's
  (after a `.`) nor inside a string or exponent (after a letter), is parsed
  by the standard library, which keeps every integer exact.
"""

from __future__ import annotations

import importlib
import json
import math
from typing import Any

__all__ = ["dumps", "loads"]


def _optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


# None when orjson is not installed (tests set it to None to take the stdlib path).
_orjson: Any = _optional("orjson")
# numpy finds a long digit run in a large body faster; it is imported on first
# such body only, so importing this package never loads it.
_NUMPY_MIN_BYTES = 1 << 20
_numpy: Any = None

# 2**64 - 1 has 20 digits: a shorter run of digits is an integer orjson holds exactly.
_LONG_RUN = 20
# Every ASCII digit to "d", "." and ASCII letters to ".", every other byte to " ": a long
# integer is then a run of "d" after a " " (after a "." it is a fraction's digits, after a
# letter a string's or an exponent's: orjson reads both exactly enough).
_NOT_AN_INTEGER_BEFORE = frozenset(b".ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_DIGITS_ONLY = bytes(
    ord("d") if 48 <= byte <= 57 else ord(".") if byte in _NOT_AN_INTEGER_BEFORE else ord(" ")
    for byte in range(256)
)
_LONG_INTEGER = b" " + b"d" * _LONG_RUN


def _has_long_digit_run(content: bytes) -> bool:
    """Whether `content` holds an integer of `_LONG_RUN` or more ASCII digits.

    A run right after a `.` (a fraction) or an ASCII letter (inside a string,
    such as a hex digest, or an exponent) is not an integer.
    """
    global _numpy
    if _numpy is None and len(content) >= _NUMPY_MIN_BYTES:
        _numpy = _optional("numpy") or False
    if not _numpy:
        return (b" " + content.translate(_DIGITS_ONLY)).find(_LONG_INTEGER) >= 0
    # Run lengths by doubling: two overlapping runs of length k make one of 2k.
    text = _numpy.frombuffer(content, dtype=_numpy.uint8)
    digits = (text >= 48) & (text <= 57)
    runs = digits
    for shift in (1, 2, 4, 8):  # runs of 2, 4, 8, 16
        runs = runs[:-shift] & runs[shift:]
        if not runs.any():
            return False
    starts = _numpy.flatnonzero(runs[:-4] & runs[4:])  # 16 and 16 four apart: 20
    previous = _numpy.maximum(starts - 1, 0)
    # A run after another digit lies inside a longer one (counted at its start).
    before = text[previous] | 0x20  # ASCII letters folded to lower case; "." stays "."
    letter = (before >= ord("a")) & (before <= ord("z"))
    inside = digits[previous] | (before == ord(".")) | letter
    return bool(((starts == 0) | ~inside).any())


def loads(content: bytes | str) -> Any:
    """The parsed JSON document; ValueError (json.JSONDecodeError) when it is not JSON."""
    if _orjson is not None:
        raw = content.encode() if isinstance(content, str) else content
        if not _has_long_digit_run(raw):
            try:
                return _orjson.loads(raw)
            except ValueError:  # orjson.JSONDecodeError: retry with the more lenient stdlib
                pass
    return json.loads(content)


def _plain(value: Any) -> Any:
    # Arrays from numpy (or anything with the same method) become lists, without
    # this package having to import numpy.
    to_list = getattr(value, "tolist", None)
    if callable(to_list):
        return to_list()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _has_non_finite(value: Any) -> bool:
    """Whether `value` holds a NaN or an infinity anywhere (no per-number Python work)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(map(_has_non_finite, value.values()))
    if isinstance(value, list | tuple):
        try:
            # A non-finite float makes the sum non-finite; finite ones can only
            # overflow into a false alarm, which costs a slower encoding, not a value.
            total = sum(value)
        except (TypeError, OverflowError):  # not all numbers: look at each
            return any(map(_has_non_finite, value))
        return isinstance(total, float) and not math.isfinite(total)
    if isinstance(value, str | int | bool) or value is None:
        return False
    to_list = getattr(value, "tolist", None)  # an array, as `_plain` will write it
    return callable(to_list) and _has_non_finite(to_list())


def _stdlib_dumps(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, default=_plain).encode()


def dumps(payload: Any) -> bytes:
    """Compact JSON: orjson's bytes when it can write them exactly, the stdlib's otherwise.

    TypeError (or ValueError) when `payload` is not JSON serializable.
    """
    if _orjson is not None:
        try:
            encoded: bytes = _orjson.dumps(payload, default=_plain)
        except TypeError:  # orjson.JSONEncodeError: a big integer, a non-string key, ...
            pass
        else:
            if b"null" not in encoded or not _has_non_finite(payload):
                return encoded
    return _stdlib_dumps(payload)
