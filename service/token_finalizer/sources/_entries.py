"""Turning what a writer hands to `put` into one validated, canonical line."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from token_finalizer.core.codec import PromptReuse, dumps_entry_line, loads_json
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


def parse_capture(lines: Iterable[bytes], rollout_id: str, where: str) -> tuple[TokenEntry, ...]:
    """The entries of one rollout's stored lines (put order), first copy of each call id.

    One `PromptReuse` across the lines parses each prompt by what it adds to
    the one before. A line of another rollout is an error naming `where`.
    """
    prompts = PromptReuse()
    entries: dict[str, TokenEntry] = {}
    for line in lines:
        if not line.strip():  # bytes.strip() returns the line itself when nothing is stripped
            continue
        entry = TokenEntry.from_json(line, prompts=prompts)
        if entry.rollout_id != rollout_id:
            raise TokenEntryError(f"{where} holds an entry of rollout {entry.rollout_id}")
        entries.setdefault(entry.model_call_id, entry)
    return tuple(entries.values())
