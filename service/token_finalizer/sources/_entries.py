"""Turning what a writer hands to `put` into one validated, canonical line."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from token_finalizer.core.codec import (
    PromptReuse,
    dumps_entry_line,
    has_long_digit_run,
    loads_json,
)
from token_finalizer.core.entries import TokenEntry
from token_finalizer.core.errors import TokenEntryError
from token_finalizer.core.identity import check_new_store_id

__all__ = ["entry_parts", "entry_payload"]


def entry_payload(entry: object) -> tuple[TokenEntry, bytes]:
    """Validate `entry` (a TokenEntry, a mapping, or a pydantic model) before any I/O.

    Returns the parsed entry and the compact sorted-key line the stores keep
    (and digest): the payload as given, so unknown fields survive.
    """
    parsed, line, _ = entry_parts(entry)
    return parsed, line


def entry_parts(entry: object) -> tuple[TokenEntry, bytes, Mapping[str, Any]]:
    """`entry_payload`, and the payload its line encodes (what packing cuts up)."""
    if isinstance(entry, TokenEntry):
        payload = entry.to_dict()
    elif isinstance(entry, Mapping):
        payload = dict(entry)
    else:
        model_dump = getattr(entry, "model_dump", None)
        if not callable(model_dump):
            raise TokenEntryError(f"a TokenEntry must be a mapping, got {type(entry).__name__}")
        payload = model_dump()
    _require_token_arrays(payload)
    parsed = TokenEntry.from_dict(payload)
    # Writes only: an id finalize would refuse is never stored
    # (docs/records-and-builds.md#store-id-rule).
    check_new_store_id(parsed.rollout_id, what="rollout_id")
    try:
        line = dumps_entry_line(payload)
    except TypeError:  # orjson: an integer outside 64 bits, or a value JSON cannot hold
        line = b""
    if not line or has_long_digit_run(line):
        # A stored line is read back by orjson, which holds integers of [-2**63, 2**64)
        # only (and reads a longer one as a float): refuse one before it is stored.
        where = _wide_integer(payload)
        if where is not None:
            raise TokenEntryError(
                f"{where} holds an integer outside [-2**63, 2**64), which a capture line "
                "cannot hold exactly"
            )
    if not line:
        raise TokenEntryError("the entry holds a value that is not JSON")
    return parsed, line, payload


# NeMo Gym's TokenEntry requires these: a written call without one is no capture.
# A reader still takes an old line without them as empty (core/entries.py).
_TOKEN_ARRAYS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


def _require_token_arrays(payload: Mapping[str, Any]) -> None:
    """TokenEntryError naming the token arrays `payload` lacks: three key lookups, no element."""
    missing = [key for key in _TOKEN_ARRAYS if key not in payload]
    if missing:
        raise TokenEntryError(
            f"a TokenEntry must hold its token arrays: {', '.join(missing)} missing"
        )


_INTEGER_LOW, _INTEGER_END = -(2**63), 2**64


def _wide_integer(payload: Mapping[str, Any]) -> str | None:
    """The path (`cum_len`, `meta.sizes[2]`) of an integer orjson cannot hold, or None.

    Walked without recursion: the payload's depth is bounded by the body reader,
    not here.
    """
    pending: list[tuple[str, Any]] = [(str(key), value) for key, value in payload.items()]
    while pending:
        where, value = pending.pop()
        if isinstance(value, int) and not isinstance(value, bool):
            if not _INTEGER_LOW <= value < _INTEGER_END:
                return where
        elif isinstance(value, Mapping):
            pending.extend((f"{where}.{key}", item) for key, item in value.items())
        elif isinstance(value, list | tuple):
            pending.extend((f"{where}[{index}]", item) for index, item in enumerate(value))
    return None


def same_payload(stored: bytes, line: bytes) -> bool:
    """Whether two entry lines hold the same payload (another encoder's bytes may differ)."""
    try:
        return bool(loads_json(stored) == loads_json(line))
    except ValueError:  # an unreadable stored line is not the same payload
        return False


def parse_capture(lines: Iterable[bytes], rollout_id: str, where: str) -> tuple[TokenEntry, ...]:
    """The entries of one rollout's stored lines, in put order, every line one entry.

    A line stored twice (a relay that appended it again) is two entries, as
    NeMo Gym 0.7 reads it: `n_calls` counts both, and the builder keeps one
    (docs/records-and-builds.md#snapshots). One `PromptReuse` across the lines
    parses each prompt by what it adds to the one before. A line of another
    rollout is an error naming `where`.
    """
    prompts = PromptReuse()
    entries: list[TokenEntry] = []
    for line in lines:
        if not line.strip():  # bytes.strip() returns the line itself when nothing is stripped
            continue
        entry = TokenEntry.from_json(line, prompts=prompts)
        if entry.rollout_id != rollout_id:
            raise TokenEntryError(f"{where} holds an entry of rollout {entry.rollout_id}")
        entries.append(entry)
    return tuple(entries)
