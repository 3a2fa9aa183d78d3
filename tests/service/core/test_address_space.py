"""A large JSON document is parsed only while the address space left can hold orjson's pool.

RLIMIT_AS is stood in for (`resource.getrlimit`), so that this process keeps
its own; the real limit is tests/integration/test_memory_ceiling.py.
"""

from __future__ import annotations

import resource
from collections.abc import Callable
from typing import Any

import pytest

from token_finalizer._constants import JSON_PARSE_ADDRESS_FACTOR, JSON_PARSE_CHECK_MIN_BYTES
from token_finalizer.core import address_space
from token_finalizer.core.address_space import ParseRoomError, check_parse_room
from token_finalizer.core.codec import loads_json, loads_strict_json

MIB = 1024 * 1024


def _limit_at(monkeypatch: pytest.MonkeyPatch, free_bytes: int) -> None:
    """RLIMIT_AS as if the process had `free_bytes` left under it."""
    with open("/proc/self/statm", "rb") as statm:
        used = int(statm.read().split()[0]) * resource.getpagesize()
    limit = used + free_bytes
    monkeypatch.setattr(address_space.resource, "getrlimit", lambda _: (limit, limit))


def test_without_a_limit_nothing_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """RLIM_INFINITY: any size may be parsed."""
    infinity = resource.RLIM_INFINITY
    monkeypatch.setattr(address_space.resource, "getrlimit", lambda _: (infinity, infinity))
    assert address_space.address_space_left() is None
    check_parse_room(10**12)


def test_a_document_needing_more_than_is_left_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 16 MiB document with 100 MiB left is a ParseRoomError (a MemoryError)."""
    _limit_at(monkeypatch, 100 * MIB)
    with pytest.raises(MemoryError, match="RLIMIT_AS"):
        check_parse_room(16 * MIB)


def test_a_document_that_fits_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    """With its size times the factor free (and more), the check passes."""
    size = JSON_PARSE_CHECK_MIN_BYTES
    _limit_at(monkeypatch, size * JSON_PARSE_ADDRESS_FACTOR + 256 * MIB)
    check_parse_room(size)


def test_small_documents_are_not_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below the minimum size nothing is read, even with no room left."""
    _limit_at(monkeypatch, -MIB)
    check_parse_room(JSON_PARSE_CHECK_MIN_BYTES - 1)
    assert loads_json(b'{"a": 1}') == {"a": 1}


@pytest.mark.parametrize("loads", [loads_json, loads_strict_json])
def test_the_codecs_refuse_before_orjson_starts(
    loads: Callable[[bytes], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both orjson entry points of the codec raise ParseRoomError for a document too large."""
    _limit_at(monkeypatch, 64 * MIB)
    document = b'["' + b"a" * (8 * MIB) + b'"]'
    with pytest.raises(ParseRoomError):
        loads(document)
