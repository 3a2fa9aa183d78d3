"""A resolve answer's cumulative token ids, in either form, as a tuple of ints.

The resolver asks for the compact form (`?tokens=compact`,
docs/store-protocol.md#the-lineage-resolver): the match then carries

    "cumulative_tokens": {"encoding": "u32le" | "u64le", "length": n, "data": "<base64>"}

the ids as little-endian unsigned integers of 4 or 8 bytes, in standard
base64, instead of a JSON list. Decoding it is `binascii` and `struct` work
in C (`struct.unpack` builds the tuple of ints at once), no Python per
token, and the body is smaller than the list. A store
that does not know the parameter answers the plain form
(`"cumulative_token_ids": [...]`), which is still read; its checks run in C
too (`set(map(type, ...))`, `min`, `max`).

A resolve that named a known prefix (the rollout's last match, whose ids
the client holds) may be answered with only the ids after it: the compact
form then carries `"offset": n`, the number of known ids its data follows,
and the ids are the known ones plus the data's (docs/store-protocol.md#known-prefix).

Anything else (both forms, neither, an unknown encoding, a length that is
not the data's, data that is not base64, ids outside [0, 2**64), an offset
that is not the known prefix's length) is a `InvalidAnswerError`, which the
resolver answers as a lookup error.
"""

from __future__ import annotations

import binascii
import struct
from typing import Any

from token_finalizer_client._exceptions import InvalidAnswerError

__all__ = ["COMPACT_FIELD", "PLAIN_FIELD", "cumulative_token_ids"]

PLAIN_FIELD = "cumulative_token_ids"
COMPACT_FIELD = "cumulative_tokens"
_ID_LIMIT = 2**64


# Encoding name -> (bytes per id, `struct` format code: standard sizes after "<").
_ENCODINGS = {"u32le": (4, "I"), "u64le": (8, "Q")}


def _plain(value: object) -> tuple[int, ...]:
    if (
        not isinstance(value, list)
        or not set(map(type, value)) <= {int}
        or min(value, default=0) < 0
        or max(value, default=0) >= _ID_LIMIT
    ):
        raise InvalidAnswerError(f"{PLAIN_FIELD} is not a list of token ids")
    return tuple(value)


def _compact(value: object, known: tuple[int, ...]) -> tuple[int, ...]:
    if not isinstance(value, dict):
        raise InvalidAnswerError(f"{COMPACT_FIELD} is not an object")
    if "offset" in value:
        offset = value["offset"]
        if type(offset) is not int or offset != len(known):
            raise InvalidAnswerError(
                f"{COMPACT_FIELD} follows {offset!r:.40} known ids; {len(known)} were named"
            )
        return known + _compact_data(value)
    return _compact_data(value)


def _compact_data(value: dict[str, Any]) -> tuple[int, ...]:
    encoding, length, data = value.get("encoding"), value.get("length"), value.get("data")
    layout = _ENCODINGS.get(encoding) if isinstance(encoding, str) else None
    if layout is None:
        raise InvalidAnswerError(f"{COMPACT_FIELD} has an unknown encoding: {encoding!r:.40}")
    if type(length) is not int or length < 0:
        raise InvalidAnswerError(f"{COMPACT_FIELD} has no valid length: {length!r:.40}")
    if not isinstance(data, str):
        raise InvalidAnswerError(f"{COMPACT_FIELD}'s data is not a string")
    width, code = layout
    if len(data) != 4 * -(-length * width // 3):  # standard base64 of exactly that many bytes
        raise InvalidAnswerError(
            f"{COMPACT_FIELD} holds {len(data)} base64 characters, "
            f"not the {length} ids of {width} bytes it announces"
        )
    try:
        raw = binascii.a2b_base64(data, strict_mode=True)
    except (binascii.Error, ValueError) as exc:  # ValueError: not ASCII
        raise InvalidAnswerError(f"{COMPACT_FIELD}'s data is not standard base64: {exc}") from None
    if len(raw) != length * width:
        raise InvalidAnswerError(
            f"{COMPACT_FIELD} decodes to {len(raw)} bytes, not {length} ids of {width} bytes"
        )
    # Little-endian on every platform, straight into a tuple: no array in between.
    ids: tuple[int, ...] = struct.unpack(f"<{length}{code}", raw)
    return ids


def cumulative_token_ids(match: dict[str, Any], known: tuple[int, ...] = ()) -> tuple[int, ...]:
    """The match's cumulative token ids, from whichever form it carries (exactly one).

    `known`: the ids of the known prefix the resolve named (none: empty).
    """
    has_plain, has_compact = PLAIN_FIELD in match, COMPACT_FIELD in match
    if has_plain == has_compact:
        which = "both" if has_plain else "neither"
        raise InvalidAnswerError(f"the match carries {which} of {PLAIN_FIELD} and {COMPACT_FIELD}")
    if has_compact:
        return _compact(match[COMPACT_FIELD], known)
    return _plain(match[PLAIN_FIELD])
