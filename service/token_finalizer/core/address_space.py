"""Room to parse: a large JSON document is parsed only while the address space allows it.

orjson reserves a value pool of up to about 12x a document's size before it
parses it and does not survive an allocation that fails afterwards: under an
address-space limit (`prlimit --as`, a container's RLIMIT_AS) a 200 MB freeze
answer killed the finalizer with SIGSEGV (issue 29). A document of at least
`JSON_PARSE_CHECK_MIN_BYTES` is therefore parsed only while
`JSON_PARSE_ADDRESS_FACTOR` times its size is free under the limit; otherwise
`ParseRoomError` (a MemoryError) refuses it before orjson starts. Without a
limit nothing is checked (docs/configuration.md#memory-ceilings).
"""

from __future__ import annotations

import resource

from token_finalizer._constants import JSON_PARSE_ADDRESS_FACTOR, JSON_PARSE_CHECK_MIN_BYTES

__all__ = ["ParseRoomError", "address_space_left", "check_parse_room"]


class ParseRoomError(MemoryError):
    """A JSON document too large for the address space the process has left."""


def address_space_left() -> int | None:
    """Bytes of address space left under RLIMIT_AS; None without a limit (or a way to tell)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/statm", "rb") as statm:  # total program size, in pages
            pages = int(statm.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return soft - pages * resource.getpagesize()


def check_parse_room(size: int) -> None:
    """Raise ParseRoomError unless a document of `size` bytes can be parsed in the space left."""
    if size < JSON_PARSE_CHECK_MIN_BYTES:
        return
    left = address_space_left()
    needed = size * JSON_PARSE_ADDRESS_FACTOR
    if left is not None and left < needed:
        raise ParseRoomError(
            f"parsing {size} bytes of JSON needs about {needed} bytes of address space; "
            f"{max(left, 0)} are left under the process's limit (RLIMIT_AS)"
        )
