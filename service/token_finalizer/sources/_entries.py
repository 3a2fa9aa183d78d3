"""Turning what a writer hands to `put` into one validated, canonical line."""

from __future__ import annotations

from collections.abc import Mapping

from token_finalizer.core.codec import dumps_entry_line, loads_json
from token_finalizer.core.entries import TokenEntry
from token_finalizer.core.errors import TokenEntryError

__all__ = ["entry_payload"]


def entry_payload(entry: object) -> tuple[TokenEntry, bytes]:
    """Validate `entry` (a TokenEntry, a mapping, or a pydantic model) before any I/O.

    Returns the parsed entry and the compact sorted-key line the stores keep
    (and digest): the payload as given, so unknown fields survive.
    """
    if isinstance(entry, TokenEntry):
        payload = entry.to_dict()
    elif isinstance(entry, Mapping):
        payload = dict(entry)
    else:
        model_dump = getattr(entry, "model_dump", None)
        if not callable(model_dump):
            raise TokenEntryError(f"a TokenEntry must be a mapping, got {type(entry).__name__}")
        payload = model_dump()
    parsed = TokenEntry.from_dict(payload)
    return parsed, dumps_entry_line(payload)


def same_payload(stored: bytes, line: bytes) -> bool:
    """Whether two entry lines hold the same payload (another encoder's bytes may differ)."""
    try:
        return bool(loads_json(stored) == loads_json(line))
    except ValueError:  # an unreadable stored line is not the same payload
        return False
