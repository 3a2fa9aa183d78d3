"""A rollout's entries read from their stored values, never from their lines' text.

A full-prompt rollout of 100 calls repeats its context in every prompt: its
canonical lines spell O(calls x context) ids. Stores keep such entries as a
reference to the parent's ids plus the suffix (`_packed`), so the reader here
turns each packed record into its entry directly: the prompt is a view of the
tape the parent's cumulative ids are on (the suffix appended to it), the
other arrays are decoded from the record, and only the small rest of the line
(its skeleton) is parsed as JSON. Reading and parsing a rollout costs
O(context), and the entries are those `TokenEntry.from_json` makes of the
lines, value for value and dtype for dtype. Plain lines (old data, shapes
that do not pack) are parsed as lines. The direct freezes of every store and
the `http` source's compact freeze read this way
(docs/store-protocol.md#compact-freeze).
"""

from __future__ import annotations

from collections.abc import Iterable

from token_finalizer.core.codec import PromptReuse
from token_finalizer.core.entries import TokenEntry
from token_finalizer.core.errors import TokenEntryError
from token_finalizer.sources._packed import RolloutIds, is_packed

__all__ = ["StoredEntries", "stored_entries"]


class StoredEntries:
    """Reads one rollout's stored values into entries, fed in put order."""

    __slots__ = ("_ids", "_in_snapshot", "_prompts")

    def __init__(self, *, in_snapshot: bool = False) -> None:
        """`in_snapshot`: the records came in a freeze answer, whose plain form the http
        source parses as one document (`TokenEntry.from_stored_parts`)."""
        self._ids = RolloutIds()
        self._in_snapshot = in_snapshot
        self._prompts = PromptReuse()  # plain lines: each prompt parsed by its new tail

    def record(self, record: bytes) -> TokenEntry:
        """The entry of a packed record (CaptureCorrupt when it is unreadable, or refers
        to a call not fed before it)."""
        parts = self._ids.read(record)
        return TokenEntry.from_stored_parts(
            parts.skeleton,
            parts.prompt,
            parts.generation,
            parts.log_probs,
            in_snapshot=self._in_snapshot,
        )

    def line(self, line: bytes) -> TokenEntry:
        """The entry of a plain line."""
        return self.entry(TokenEntry.from_json(line, prompts=self._prompts))

    def entry(self, entry: TokenEntry) -> TokenEntry:
        """An entry of a plain line parsed elsewhere, noted in case a later record refers
        to it."""
        self._ids.learn_later(entry)
        return entry

    def value(self, value: bytes) -> TokenEntry:
        """The entry of one stored value: a packed record or a plain line."""
        return self.record(value) if is_packed(value) else self.line(value)


def stored_entries(values: Iterable[bytes], rollout_id: str, where: str) -> tuple[TokenEntry, ...]:
    """The entries of one rollout's stored values in put order: what `parse_capture` makes
    of their canonical lines (blank lines skipped; an entry of another rollout is an error
    naming `where`)."""
    reader = StoredEntries()
    entries: list[TokenEntry] = []
    for value in values:
        if is_packed(value):
            entry = reader.record(value)
        elif value.strip():
            entry = reader.line(value)
        else:
            continue
        if entry.rollout_id != rollout_id:
            raise TokenEntryError(f"{where} holds an entry of rollout {entry.rollout_id}")
        entries.append(entry)
    return tuple(entries)
