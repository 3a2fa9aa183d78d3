"""Reading an append-only line file of the capture directory on from where this process stopped.

The ledger (`R.lineage.jsonl`) and the staged calls (`R.staged.jsonl`) only
ever grow while a rollout lives, so a process keeps, per file, where it
stopped reading (`Tail`: the file's identity and the byte offset after the
last complete line) and reads only what was appended since. A file that is
not the one read before (another inode, shorter than the offset, or other
first bytes: deleted and written again) is read again from its start.

Callers hold the rollout's exclusive flock, so no writer is half-way through
a line: a last line without its newline was left by a writer that died
mid-write and was never acknowledged, and is cut off.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from token_finalizer.core.errors import CaptureCorrupt
from token_finalizer.sources.file._fs import append_durably, open_regular

__all__ = ["Appended", "Tail", "append_line", "read_appended"]

# The first bytes of a file that identify it beside its inode: a file deleted
# and written again may get the same inode back.
_HEAD_BYTES = 256


@dataclass(frozen=True, slots=True)
class Tail:
    """Where this process stopped reading one file: its identity and the offset."""

    device: int
    inode: int
    offset: int
    head: bytes


@dataclass(frozen=True, slots=True)
class Appended:
    """The complete lines after a Tail, each with its byte offset, and the new Tail.

    `restarted`: the file is not the one read before, so `lines` are all of
    it and whatever was built from the old one must be dropped.
    """

    lines: tuple[tuple[int, bytes], ...]
    restarted: bool
    tail: Tail | None


def _same_file(handle: BinaryIO, info: os.stat_result, tail: Tail) -> bool:
    if (info.st_dev, info.st_ino) != (tail.device, tail.inode) or info.st_size < tail.offset:
        return False
    handle.seek(0)
    return bool(handle.read(len(tail.head)) == tail.head)


def _cut(path: Path, info: os.stat_result, offset: int) -> None:
    """Truncate `path` at `offset`: the very file that was read, never another."""
    fd = open_regular(path, os.O_WRONLY, writing=True)
    try:
        now = os.fstat(fd)
        if (now.st_ino, now.st_dev) != (info.st_ino, info.st_dev):
            raise CaptureCorrupt(f"{path.name} was replaced while it was being read")
        os.ftruncate(fd, offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_appended(path: Path, tail: Tail | None) -> Appended:
    """The complete lines of `path` after `tail` (empty lines skipped); cuts a torn last line."""
    try:
        handle = os.fdopen(open_regular(path, os.O_RDONLY), "rb")
    except FileNotFoundError:
        return Appended((), tail is not None, None)
    with handle:
        info = os.fstat(handle.fileno())
        restarted = tail is None or not _same_file(handle, info, tail)
        start = 0 if restarted or tail is None else tail.offset
        handle.seek(start)
        data = handle.read(info.st_size - start)
    *complete, torn = data.split(b"\n")
    lines: list[tuple[int, bytes]] = []
    offset = start
    for line in complete:
        if line.strip():
            lines.append((offset, line))
        offset += len(line) + 1
    if torn:
        _cut(path, info, offset)
    if start == 0:
        head = data[: min(_HEAD_BYTES, offset)]
    else:
        assert tail is not None
        head = tail.head
    return Appended(tuple(lines), restarted, Tail(info.st_dev, info.st_ino, offset, head))


def append_line(path: Path, line: bytes, tail: Tail | None) -> Tail | None:
    """Append `line` and a newline durably; the Tail after it when `tail` was the file's end.

    None when the file was not where `tail` said (the caller reads it again);
    StoreFull when out of space, with nothing of the line left behind.
    """
    data = line + b"\n"
    start = append_durably(path, data)
    info = os.lstat(path)
    if start == 0:
        return Tail(info.st_dev, info.st_ino, len(data), data[:_HEAD_BYTES])
    if tail is None or (tail.device, tail.inode, tail.offset) != (info.st_dev, info.st_ino, start):
        return None
    return Tail(tail.device, tail.inode, start + len(data), tail.head)
