"""A resolve match's cumulative ids: the compact form decoded exactly, the plain form still read."""

from __future__ import annotations

import base64
import struct
from typing import Any

import pytest

from token_finalizer_client import InvalidAnswerError
from token_finalizer_client._cumulative import cumulative_token_ids

SMALL = [0, 1, 255, 65_536, 151_000, 2**32 - 1]
LARGE = [0, 7, 2**32, 2**63, 2**63 + 5, 2**64 - 1]


def compact(ids: list[int], encoding: str = "u32le", **overrides: Any) -> dict[str, Any]:
    """A match carrying `ids` in the compact form (as the store writes it), fields overridable."""
    code = "<%dI" if encoding == "u32le" else "<%dQ"
    data = base64.b64encode(struct.pack(code % len(ids), *ids)).decode()
    form = {"encoding": encoding, "length": len(ids), "data": data, **overrides}
    return {"cumulative_tokens": form}


@pytest.mark.parametrize(
    ("ids", "encoding"),
    [(SMALL, "u32le"), (LARGE, "u64le"), (SMALL, "u64le"), ([], "u32le")],
    ids=["u32le", "u64le-above-2**63", "u64le-small", "empty"],
)
def test_compact_ids_decode_exactly(ids: list[int], encoding: str) -> None:
    """Little-endian ids of 4 or 8 bytes come back as the same ints, up to 2**64 - 1."""
    decoded = cumulative_token_ids(compact(ids, encoding))
    assert decoded == tuple(ids) and all(type(value) is int for value in decoded)


def test_plain_ids_are_still_read() -> None:
    """A store that ignores `tokens=compact` answers the list form, read as before."""
    assert cumulative_token_ids({"cumulative_token_ids": LARGE}) == tuple(LARGE)


@pytest.mark.parametrize(
    "match",
    [
        compact(SMALL, length=len(SMALL) + 1),
        compact(SMALL, length=len(SMALL) - 1),
        compact(SMALL, length=-1),
        compact(SMALL, length=True),
        compact(SMALL, length="6"),
        compact(SMALL, encoding="u16le"),
        compact(SMALL, encoding=None),
        compact(SMALL, data=None),
        compact(SMALL, data="!" * 32),
        compact([1, 2, 3], data=base64.b64encode(b"\x01" * 12).decode().replace("A", "é")),
        {"cumulative_tokens": [1, 2, 3]},
        {**compact(SMALL), "cumulative_token_ids": SMALL},
        {},
        {"cumulative_token_ids": [1, -2]},
        {"cumulative_token_ids": [1, 2**64]},
        {"cumulative_token_ids": [1, 2.0]},
        {"cumulative_token_ids": [True]},
        {"cumulative_token_ids": "1,2"},
    ],
    ids=[
        "length-too-long",
        "length-too-short",
        "length-negative",
        "length-bool",
        "length-text",
        "unknown-encoding",
        "no-encoding",
        "data-not-text",
        "data-not-base64",
        "data-not-ascii",
        "form-not-an-object",
        "both-forms",
        "neither-form",
        "plain-negative",
        "plain-2**64",
        "plain-float",
        "plain-bool",
        "plain-not-a-list",
    ],
)
def test_malformed_ids_are_refused(match: dict[str, Any]) -> None:
    """A length or encoding that does not fit, bad data, or both or neither forms: refused."""
    with pytest.raises(InvalidAnswerError):
        cumulative_token_ids(match)


def test_ids_after_a_known_prefix_are_appended_to_it() -> None:
    """`offset` equal to the known ids' length: the ids are the known ones, then the data's."""
    known = (5, 6, 7)
    match = compact([8, 9], offset=3)
    assert cumulative_token_ids(match, known) == (5, 6, 7, 8, 9)


@pytest.mark.parametrize(
    ("offset", "known"),
    [(3, ()), (2, (5, 6, 7)), (4, (5, 6, 7)), ("3", (5, 6, 7)), (True, (5,))],
    ids=["nothing-known", "shorter", "longer", "text", "bool"],
)
def test_an_offset_that_is_not_the_known_length_is_refused(
    offset: object, known: tuple[int, ...]
) -> None:
    """Ids after a prefix the client did not name (or of another length) cannot be rebuilt."""
    with pytest.raises(InvalidAnswerError, match="known ids"):
        cumulative_token_ids(compact([8, 9], offset=offset), known)
