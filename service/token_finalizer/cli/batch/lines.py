"""JSONL in and out: input lines parsed one at a time, and an output made durable."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from token_finalizer.cli.batch.progress import Progress

__all__ = ["Line", "fsync", "read_jsonl"]


@dataclass(slots=True)
class Line:
    """One input line: its parsed object, or why it is not one."""

    number: int
    data: dict[str, Any] | None
    error: str | None = None


def _parse_line(number: int, raw: bytes, max_depth: int | None) -> Line:
    """Input line `number` as a JSON object, or the reason it is not one.

    Integers are read exactly at any size, as the service reads a body. With
    `max_depth`, a line nesting deeper is refused before it is parsed, as the
    service refuses such a body (docs/finalizer-api.md#limits): its answer
    could not be written back.
    """
    from token_finalizer.core.codec import json_depth, json_type_name, loads_exact_json

    text = raw.rstrip(b"\r\n")
    if not text.strip():
        return Line(number, None, "empty line; expected a JSON object")
    if max_depth is not None:
        depth = json_depth(text)
        if depth > max_depth:
            return Line(
                number, None, f"JSON nests {depth} levels deep; at most {max_depth} are accepted"
            )
    try:
        value = loads_exact_json(text)
    except ValueError as exc:
        return Line(number, None, f"not valid JSON: {exc}")
    if not isinstance(value, dict):
        kind = json_type_name(value)
        article = "" if kind == "null" else "an " if kind == "array" else "a "
        return Line(number, None, f"not a JSON object (got {article}{kind})")
    return Line(number, value)


def read_jsonl(
    handle: IO[bytes], progress: Progress | None = None, *, max_depth: int | None = None
) -> Iterator[Line]:
    """Every line of `handle`, numbered from 1 and parsed, lazily; `progress` counts the bytes.

    A line nesting deeper than `max_depth` (when given) is not parsed: its
    `error` says how deep it goes.
    """
    for number, raw in enumerate(handle, start=1):
        if progress is not None:
            progress.advance(len(raw))
        yield _parse_line(number, raw, max_depth)


def fsync(handle: IO[bytes], path: Path) -> None:
    """Flush and fsync the file `handle` writes at `path`, and the directory entry naming it."""
    handle.flush()
    os.fsync(handle.fileno())
    # A new file's directory entry is durable only once its directory is synced.
    directory = os.open(path.resolve().parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
