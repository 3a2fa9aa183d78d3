"""Reading a capture jsonl as its readers see it: every packed line expanded."""

from __future__ import annotations

from token_finalizer.sources._packed import expand_lines, from_file_line


def canonical_lines(raw: bytes) -> tuple[bytes, ...]:
    """The canonical entry lines of a jsonl's bytes (docs/store-protocol.md#packed-at-rest)."""
    return expand_lines(from_file_line(line) for line in raw.splitlines() if line.strip())
