"""Filesystem primitives of the file store: opening only regular files, durable writes.

Hostile directories: every capture file is opened with O_NOFOLLOW and
O_NONBLOCK and must then be a regular file (fstat), so a symlink, FIFO,
device or directory planted under a capture file's name is refused with
CaptureCorrupt naming that file, and nothing outside the directory is read or
written; a file that is also hard-linked elsewhere is never written. Running
out of space (ENOSPC, EFBIG, EDQUOT) raises StoreFull after undoing the
half-written part. See docs/store-protocol.md#file-store.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from token_finalizer.core.errors import CaptureCorrupt, CaptureError, StoreFull

__all__ = [
    "append_durably",
    "exists",
    "fsync_dir",
    "not_regular",
    "open_regular",
    "read_file",
    "read_id_lines",
    "space_error",
    "split_lines",
    "truncate",
    "write_all",
]

# Writes that fail because the disk or the quota is full: StoreFull.
_NO_SPACE = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})
# Open errors that mean "not a regular file" under O_NOFOLLOW | O_NONBLOCK:
# a symlink (ELOOP), a FIFO without reader or a socket (ENXIO), a directory (EISDIR).
_NOT_REGULAR = frozenset({errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.ENODEV})


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def not_regular(name: str, mode: int | None = None, *, what: str | None = None) -> CaptureCorrupt:
    """CaptureCorrupt for a capture file that is not a regular file (only its own name shown)."""
    kind = what if what is not None else _kind(mode) if mode is not None else "not a regular file"
    return CaptureCorrupt(
        f"{name} is {kind}, not a regular file; the capture store will not use it "
        "(remove it, or the rollout with `token-finalizer store delete`)"
    )


def _refused(path: Path) -> CaptureCorrupt:
    """Why `path` could not be opened as a regular file (it is looked at, never followed)."""
    try:
        mode: int | None = os.lstat(path).st_mode
    except OSError:
        mode = None
    return not_regular(path.name, mode)


def space_error(name: str, exc: BaseException) -> StoreFull | None:
    """StoreFull for a write that failed for want of space, else None."""
    if not isinstance(exc, OSError) or exc.errno not in _NO_SPACE:
        return None
    reason = os.strerror(exc.errno) if exc.errno is not None else "no space"
    return StoreFull(
        f"the capture store is out of space: writing {name} failed ({reason}); the call "
        "did not take effect, repeat it once space is freed"
    )


def open_regular(path: Path, flags: int, *, writing: bool = False) -> int:
    """Open a capture file: a regular file of the directory itself, never what a link names.

    O_NOFOLLOW refuses a symlink, O_NONBLOCK keeps a FIFO from blocking the
    open, and fstat must then show a regular file; with `writing`, a file
    that is also hard-linked elsewhere is refused too (a write would change
    that other file). Raises CaptureCorrupt naming the file, StoreFull when
    creating it failed for want of space, and FileNotFoundError as os.open does.
    """
    try:
        # 0o666 as open() uses: the umask decides (a shared directory may need group write).
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno in _NOT_REGULAR:
            raise _refused(path) from None
        full = space_error(path.name, exc)
        if full is not None:
            raise full from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise not_regular(path.name, info.st_mode)
        if writing and info.st_nlink > 1:
            raise CaptureCorrupt(
                f"{path.name} has {info.st_nlink} hard links; the capture store will not "
                "write a file that is also linked elsewhere"
            )
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_file(path: Path, size: int = -1, *, offset: int = 0) -> bytes | None:
    """The file's bytes from `offset` (at most `size`), or None when there is no such file."""
    try:
        fd = open_regular(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if offset:
            handle.seek(offset)
        return handle.read(size)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of `data` (os.write may write fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def truncate(path: Path, size: int) -> None:
    """Cut `path` back to `size` bytes, durably (best effort: an undo after a failed write)."""
    with contextlib.suppress(OSError, CaptureError):
        fd = open_regular(path, os.O_WRONLY, writing=True)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_dir(directory: Path) -> None:
    """Make a rename or a new name in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def append_durably(path: Path, data: bytes) -> int:
    """Append and fsync `data`; return the file's size before. A failed write is undone."""
    fd = open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, writing=True)
    try:
        start = os.fstat(fd).st_size
        try:
            write_all(fd, data)
            os.fsync(fd)
        except OSError as exc:
            # Under the exclusive lock nobody else appends: cut off whatever
            # part of `data` got in, so no torn line stays behind.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
                os.fsync(fd)
            full = space_error(path.name, exc)
            if full is not None:
                raise full from None
            raise
    finally:
        os.close(fd)
    return start


def exists(path: Path) -> bool:
    """Whether the name exists in the directory, whatever it is (a link is not followed)."""
    return os.path.lexists(path)


def split_lines(data: bytes) -> Iterator[bytes]:
    """The lines of `data` without their newlines (one slice each, no other copy)."""
    start = 0
    while start < len(data):
        end = data.find(b"\n", start)
        if end < 0:
            end = len(data)
        yield data[start:end]
        start = end + 1


def read_id_lines(path: Path) -> list[str]:
    """The non-empty lines of a call-id file (intents, incomplete); [] when absent."""
    data = read_file(path)
    if data is None:
        return []
    # Split at b"\n" only, the one separator writers put there: `str.splitlines`
    # would also split at the line separators U+2028 and U+2029, which a call id may hold.
    return [line.decode("utf-8", "replace") for line in data.split(b"\n") if line]
