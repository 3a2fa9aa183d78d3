"""The file capture store: one directory shared by writers and the finalizer.

On-disk layout per rollout id `R` (compatible with NeMo Gym's training-token
file store, so either side can read what the other wrote):

    R.tokens.jsonl        one TokenEntry per line, compact sorted-key JSON, fsynced per put
    R.tokens.state.json   CaptureState, replaced atomically (temp file + rename)
    R.tokens.lock         flock: exclusive for mutations, shared for plain reads
    R.tokens.intents      announced model call ids, one per line
    R.tokens.incomplete   model call ids that failed to capture, one per line

Every public method is async and runs its blocking file work in a thread.

Hostile directories: every capture file is opened with O_NOFOLLOW and
O_NONBLOCK and must then be a regular file (fstat), so a symlink, FIFO,
device or directory planted under a capture file's name is refused with
CaptureCorrupt naming that file, and nothing outside the directory is read or
written; a file that is also hard-linked elsewhere is never written. Running
out of space (ENOSPC, EFBIG, EDQUOT) raises StoreFull after undoing the
half-written part, so the capture stays as it was before the call.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import re
import stat
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson

from token_finalizer.core.codec import loads_json
from token_finalizer.core.entries import Snapshot, TokenEntry
from token_finalizer.core.errors import (
    CaptureConflict,
    CaptureCorrupt,
    CaptureError,
    InvalidRolloutId,
    StoreFull,
    describe_exception,
)
from token_finalizer.core.identity import check_store_id
from token_finalizer.sources._entries import entry_payload, parse_capture, same_payload
from token_finalizer.sources._state import CaptureState, PutDecision, line_digest

__all__ = [
    "STALE_FILE_AGE_S",
    "FileTokenStore",
    "FrozenLines",
    "SkippedFile",
    "SweepReport",
    "SweptCapture",
    "SweptFile",
]

logger = logging.getLogger(__name__)

_SUFFIX = ".tokens"
_Content = TypeVar("_Content")
# Every name a capture file can have, longest first (".tokens.state.json" before ".json").
_CAPTURE_SUFFIXES = (
    ".tokens.incomplete",
    ".tokens.state.json",
    ".tokens.intents",
    ".tokens.jsonl",
    ".tokens.lock",
)
# The temporary file of a state replacement: `.R.tokens.state.json.<uuid4 hex>.tmp`.
_TEMP_NAME = re.compile(r"\.(.+)\.tokens\.state\.json\.[0-9a-f]{32}\.tmp", re.ASCII | re.DOTALL)
# A state replacement lives for milliseconds: a temp file (or a lone lock file)
# this old was left by a killed writer and is removed by a sweep.
STALE_FILE_AGE_S = 60.0
# Writes that fail because the disk or the quota is full: StoreFull.
_NO_SPACE = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})
# Open errors that mean "not a regular file" under O_NOFOLLOW | O_NONBLOCK:
# a symlink (ELOOP), a FIFO without reader or a socket (ENXIO), a directory (EISDIR).
_NOT_REGULAR = frozenset({errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.ENODEV})


@dataclass(frozen=True, slots=True)
class SweptCapture:
    """One capture that a sweep removed (or would remove, in a dry run)."""

    rollout_id: str
    reason: str  # "retired", "abandoned" or "empty" (file store: frozen with nothing in it)
    age_seconds: float


@dataclass(frozen=True, slots=True)
class SweptFile:
    """One leftover file that a sweep removed (or would remove) outside any capture removal."""

    name: str
    reason: str  # "temp", "orphan" (data files of a retired capture) or "lock" (a lone lock)
    age_seconds: float


@dataclass(frozen=True, slots=True)
class SkippedFile:
    """A file (or capture) a sweep left alone because it cannot be trusted: name and why."""

    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class SweepReport:
    """Everything one file-store sweep did (or would do, in a dry run)."""

    captures: tuple[SweptCapture, ...]
    files: tuple[SweptFile, ...]
    skipped: tuple[SkippedFile, ...]


@dataclass(frozen=True, slots=True)
class FrozenLines:
    """A frozen snapshot as its stored entry lines, unparsed (what the store server sends on)."""

    rollout_id: str
    lines: tuple[bytes, ...]
    incomplete: bool
    snapshot_id: str
    version: int


@dataclass(frozen=True, slots=True)
class _SweepRules:
    retired_older_than: float
    abandoned_older_than: float | None
    empty_older_than: float | None

    def reason(self, state: CaptureState, age: float, empty: Callable[[], bool]) -> str | None:
        """Why a capture of this state and age goes, or None when it stays."""
        if state.retired:
            return "retired" if age >= self.retired_older_than else None
        if not state.frozen:
            limit = self.abandoned_older_than
            return "abandoned" if limit is not None and age >= limit else None
        limit = self.empty_older_than
        return "empty" if limit is not None and age >= limit and empty() else None


class _Paths:
    __slots__ = ("incomplete", "intents", "jsonl", "lock", "state")

    def __init__(self, directory: Path, rollout_id: str) -> None:
        stem = directory / f"{check_store_id(rollout_id)}{_SUFFIX}"
        self.jsonl = stem.with_name(stem.name + ".jsonl")
        self.state = stem.with_name(stem.name + ".state.json")
        self.lock = stem.with_name(stem.name + ".lock")
        self.intents = stem.with_name(stem.name + ".intents")
        self.incomplete = stem.with_name(stem.name + ".incomplete")

    def data_files(self) -> tuple[Path, ...]:
        return (self.jsonl, self.intents, self.incomplete)

    def stored_files(self) -> tuple[Path, ...]:
        """Every file of the rollout but its lock."""
        return (*self.data_files(), self.state)


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


def _not_regular(name: str, what: str) -> CaptureCorrupt:
    # Only the file's own name: never where a planted link points.
    return CaptureCorrupt(
        f"{name} is {what}, not a regular file; the capture store will not use it "
        "(remove it, or the rollout with `token-finalizer store delete`)"
    )


def _refused(path: Path) -> CaptureCorrupt:
    """Why `path` could not be opened as a regular file (it is looked at, never followed)."""
    try:
        what = _kind(os.lstat(path).st_mode)
    except OSError:
        what = "not a regular file"
    return _not_regular(path.name, what)


def _full(name: str, exc: OSError) -> StoreFull | None:
    """StoreFull for a write that failed for want of space, else None."""
    if exc.errno not in _NO_SPACE:
        return None
    reason = os.strerror(exc.errno) if exc.errno is not None else "no space"
    return StoreFull(
        f"the capture store is out of space: writing {name} failed ({reason}); the call "
        "did not take effect, repeat it once space is freed"
    )


def _open(path: Path, flags: int, *, writing: bool = False) -> int:
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
        full = _full(path.name, exc)
        if full is not None:
            raise full from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _not_regular(path.name, _kind(info.st_mode))
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


def _read_file(path: Path, size: int = -1) -> bytes | None:
    """The file's bytes (at most `size`), or None when there is no such file."""
    try:
        fd = _open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as handle:
        return handle.read(size)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _truncate(path: Path, size: int) -> None:
    """Cut `path` back to `size` bytes, durably (best effort: an undo after a failed write)."""
    with contextlib.suppress(OSError, CaptureError):
        fd = _open(path, os.O_WRONLY, writing=True)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _append_durably(path: Path, data: bytes) -> int:
    """Append and fsync `data`; return the file's size before. A failed write is undone."""
    fd = _open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, writing=True)
    try:
        start = os.fstat(fd).st_size
        try:
            _write_all(fd, data)
            os.fsync(fd)
        except OSError as exc:
            # Under the exclusive lock nobody else appends: cut off whatever
            # part of `data` got in, so no torn line stays behind.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
                os.fsync(fd)
            full = _full(path.name, exc)
            if full is not None:
                raise full from None
            raise
    finally:
        os.close(fd)
    return start


def _exists(path: Path) -> bool:
    """Whether the name exists in the directory, whatever it is (a link is not followed)."""
    return os.path.lexists(path)


def _read_indexed(paths: _Paths, state: CaptureState) -> bytes:
    """The indexed part of the jsonl file (nothing past the last acknowledged line)."""
    return _read_file(paths.jsonl, state.indexed_size) or b""


def _lines(data: bytes) -> Iterator[bytes]:
    start = 0
    while start < len(data):
        end = data.find(b"\n", start)
        if end < 0:
            end = len(data)
        yield data[start:end]
        start = end + 1


def _read_lines(path: Path) -> list[str]:
    data = _read_file(path)
    if data is None:
        return []
    return [line for line in data.decode("utf-8", "replace").splitlines() if line]


class FileTokenStore:
    """TokenSource and TokenSink over a local directory."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    # -- locking and state -------------------------------------------------

    @contextlib.contextmanager
    def _locked(self, paths: _Paths, *, exclusive: bool) -> Iterator[None]:
        """Hold the rollout's flock; retry if a sweep unlinked the lock file meanwhile."""
        while True:
            fd = _open(paths.lock, os.O_RDWR | os.O_CREAT, writing=True)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
                held = os.fstat(fd)
                try:
                    named = os.lstat(paths.lock)
                    same = (held.st_ino, held.st_dev) == (named.st_ino, named.st_dev)
                except FileNotFoundError:
                    same = False
                if same:
                    yield
                    return
            finally:
                os.close(fd)  # closing releases the flock

    @staticmethod
    def _check_files(paths: _Paths) -> None:
        """CaptureCorrupt unless every stored file of the rollout is absent or a regular file.

        Checked under the lock by every operation, so a link or FIFO planted
        under any of the names (even one this operation would not open)
        refuses the capture as a whole; each open checks again (O_NOFOLLOW).
        """
        for path in paths.stored_files():
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(mode):
                raise _not_regular(path.name, _kind(mode))

    def _read_state(self, paths: _Paths) -> CaptureState:
        raw = _read_file(paths.state)
        if raw is None:
            return CaptureState()
        try:
            return CaptureState.from_dict(orjson.loads(raw))
        except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError) as exc:
            raise CaptureCorrupt(f"{paths.state.name} is not a valid state file: {exc}") from None

    def _write_state(
        self, paths: _Paths, state: CaptureState, *, undo: Callable[[], None] | None = None
    ) -> None:
        """Replace the state file atomically; `undo` runs if the old state stays in place."""
        temp = paths.state.with_name(f".{paths.state.name}.{uuid.uuid4().hex}.tmp")
        created = False
        try:
            try:
                fd = _open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, writing=True)
                created = True
                try:
                    _write_all(fd, orjson.dumps(state.to_dict()))
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(temp, paths.state)
            except BaseException as exc:
                if undo is not None:
                    undo()
                full = _full(paths.state.name, exc) if isinstance(exc, OSError) else None
                if full is not None:
                    raise full from None
                raise
        finally:
            if created:
                temp.unlink(missing_ok=True)
        _fsync_dir(self.directory)

    def _index_tail(self, paths: _Paths, state: CaptureState) -> bool:
        """Index jsonl lines written after the last state update; cut a torn final line.

        A writer that crashed after its append but before its state update
        leaves a complete line behind (indexed here); one that crashed mid-line
        leaves a torn tail that was never acknowledged (cut off here). A retired
        tombstone has no data files left to index.
        """
        if state.retired:
            return False
        try:
            handle = os.fdopen(_open(paths.jsonl, os.O_RDONLY), "rb")
        except FileNotFoundError:
            if state.indexed_size:
                raise self._shorter(paths, 0, state) from None
            return False
        with handle:
            read = os.fstat(handle.fileno())
            if read.st_size == state.indexed_size:
                return False
            if read.st_size < state.indexed_size:
                raise self._shorter(paths, read.st_size, state)
            handle.seek(state.indexed_size)
            *lines, torn = handle.read().split(b"\n")
        offset = state.indexed_size
        for line in lines:
            if line.strip():
                self._index_line(paths, state, line, offset)
            offset += len(line) + 1
        if torn:
            self._cut_torn_tail(paths, read, offset)
        state.indexed_size = offset
        state.version += 1
        return True

    @staticmethod
    def _shorter(paths: _Paths, size: int, state: CaptureState) -> CaptureCorrupt:
        return CaptureCorrupt(
            f"{paths.jsonl.name} is shorter ({size} bytes) than its index "
            f"({state.indexed_size} bytes)"
        )

    @staticmethod
    def _cut_torn_tail(paths: _Paths, read: os.stat_result, offset: int) -> None:
        """Truncate the jsonl at `offset`: the very file that was read, never another."""
        fd = _open(paths.jsonl, os.O_WRONLY, writing=True)
        try:
            now = os.fstat(fd)
            if (now.st_ino, now.st_dev) != (read.st_ino, read.st_dev):
                raise CaptureCorrupt(f"{paths.jsonl.name} was replaced while it was being indexed")
            os.ftruncate(fd, offset)
            os.fsync(fd)
        finally:
            os.close(fd)

    @staticmethod
    def _index_line(paths: _Paths, state: CaptureState, line: bytes, offset: int) -> None:
        try:
            call_id = loads_json(line)["model_call_id"]
            check_store_id(call_id, what="model_call_id")
        except (ValueError, TypeError, KeyError) as exc:
            raise CaptureCorrupt(
                f"{paths.jsonl.name}: unreadable line at byte {offset} followed by more data "
                f"({type(exc).__name__}: {exc})"
            ) from None
        digest = line_digest(line)
        if state.decide_put(call_id, digest) is PutDecision.CONFLICT:
            raise CaptureCorrupt(
                f"{paths.jsonl.name}: two different lines for model call {call_id}"
            )
        state.entry_digests[call_id] = digest

    def _stored_line(self, paths: _Paths, model_call_id: str) -> bytes | None:
        with os.fdopen(_open(paths.jsonl, os.O_RDONLY), "rb") as handle:
            for line in handle:
                line = line.rstrip(b"\n")
                if line and loads_json(line).get("model_call_id") == model_call_id:
                    return line
        return None

    # -- writer side -------------------------------------------------------

    def _put(self, entry: object) -> None:
        parsed, line = entry_payload(entry)
        paths = _Paths(self.directory, parsed.rollout_id)
        digest = line_digest(line)
        with self._locked(paths, exclusive=True):
            self._check_files(paths)
            state = self._read_state(paths)
            if self._index_tail(paths, state):
                self._write_state(paths, state)
            state.check_writable(parsed.rollout_id)
            decision = state.decide_put(parsed.model_call_id, digest)
            if decision is PutDecision.CONFLICT:
                # Another serializer may have written the same payload with other bytes.
                stored = self._stored_line(paths, parsed.model_call_id)
                if stored is not None and same_payload(stored, line):
                    return
                self._mark_incomplete_locked(paths, state, parsed.rollout_id, parsed.model_call_id)
                raise CaptureConflict(
                    f"model call {parsed.model_call_id} of rollout {parsed.rollout_id} "
                    "was already stored with a different payload"
                )
            if decision is PutDecision.SAME:
                return
            start = _append_durably(paths.jsonl, line + b"\n")
            state.record_put(parsed.model_call_id, digest)
            state.indexed_size += len(line) + 1
            # If the state cannot be written (disk full), the line goes again:
            # the put failed, and the capture stays exactly as it was.
            self._write_state(paths, state, undo=lambda: _truncate(paths.jsonl, start))

    def _mark_incomplete_locked(
        self, paths: _Paths, state: CaptureState, rollout_id: str, model_call_id: str
    ) -> None:
        state.mark_incomplete(rollout_id)
        if model_call_id:
            # Kept even if the state write below fails: a freeze also counts
            # the ids in this file, so the mark is not lost to a full disk.
            _append_durably(paths.incomplete, model_call_id.encode() + b"\n")
        self._write_state(paths, state)

    def _mark_incomplete(self, rollout_id: str, model_call_id: str) -> None:
        paths = _Paths(self.directory, rollout_id)
        if model_call_id:
            check_store_id(model_call_id, what="model_call_id")
        with self._locked(paths, exclusive=True):
            self._check_files(paths)
            state = self._read_state(paths)
            self._index_tail(paths, state)
            self._mark_incomplete_locked(paths, state, rollout_id, model_call_id)

    def _begin_call(self, rollout_id: str, model_call_id: str) -> None:
        paths = _Paths(self.directory, rollout_id)
        check_store_id(model_call_id, what="model_call_id")
        with self._locked(paths, exclusive=True):
            self._check_files(paths)
            self._read_state(paths).check_writable(rollout_id)
            _append_durably(paths.intents, model_call_id.encode() + b"\n")

    async def put(self, entry: TokenEntry | Mapping[str, Any]) -> None:
        """Append one call durably; same payload again is a no-op."""
        await asyncio.to_thread(self._put, entry)

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        """Record that a call of this rollout failed to capture (allowed after freeze)."""
        await asyncio.to_thread(self._mark_incomplete, rollout_id, model_call_id)

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        """Announce a call; if its entry is missing at freeze time the snapshot is incomplete."""
        await asyncio.to_thread(self._begin_call, rollout_id, model_call_id)

    # -- finalizer side ----------------------------------------------------

    def _read_entries(
        self, paths: _Paths, state: CaptureState, rollout_id: str
    ) -> tuple[TokenEntry, ...]:
        # One read of the indexed part, then one slice per line: a long
        # rollout's capture is hundreds of MB, and buffered line reads plus
        # newline stripping would copy every line two more times.
        data = _read_indexed(paths, state)
        return parse_capture(_lines(data), rollout_id, paths.jsonl.name)

    def _frozen(
        self, rollout_id: str, read: Callable[[_Paths, CaptureState], _Content]
    ) -> tuple[_Content, CaptureState, bool]:
        """Freeze (idempotent) and `read` the capture inside the same critical section.

        Returns what `read` returned, the frozen state, and whether the
        snapshot is incomplete (a call marked failed, or announced and missing).
        """
        paths = _Paths(self.directory, rollout_id)
        with self._locked(paths, exclusive=True):
            self._check_files(paths)
            state = self._read_state(paths)
            changed = self._index_tail(paths, state)
            try:
                changed = state.freeze(rollout_id) or changed
            finally:
                if changed:
                    self._write_state(paths, state)
            content = read(paths, state)
            missing = set(_read_lines(paths.intents)) - state.entry_digests.keys()
            # An id in the incomplete file counts even if its state write failed.
            failed = bool(_read_lines(paths.incomplete))
        return content, state, state.incomplete or failed or bool(missing)

    def _freeze(self, rollout_id: str) -> Snapshot:
        entries, state, incomplete = self._frozen(
            rollout_id, lambda paths, state: self._read_entries(paths, state, rollout_id)
        )
        return Snapshot(
            rollout_id=rollout_id,
            entries=entries,
            incomplete=incomplete,
            snapshot_id=str(state.snapshot_id),
            version=state.version,
        )

    def _drop(self, rollout_id: str, snapshot_id: str, version: int) -> bool:
        paths = _Paths(self.directory, rollout_id)
        if not _exists(paths.state):
            return False
        with self._locked(paths, exclusive=True):
            self._check_files(paths)
            state = self._read_state(paths)
            if not state.names(snapshot_id, version):
                return False
            if not state.retired:
                # The tombstone first: a crash before the deletes below leaves a
                # retired capture with orphan data files (removed by the next
                # drop or a sweep), never a live capture with half its files.
                state.retired = True
                self._write_state(paths, state)
            self._remove_data_files(paths)
            return True

    @staticmethod
    def _remove_data_files(paths: _Paths) -> list[str]:
        """Unlink the rollout's data files (names only: a link's target is untouched)."""
        removed = []
        for path in paths.data_files():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path.name)
        return removed

    async def freeze(self, rollout_id: str) -> Snapshot:
        """Freeze (idempotent) and read the rollout's immutable snapshot."""
        return await asyncio.to_thread(self._freeze, rollout_id)

    # The store server's fast path: a remote freeze must not parse 30 MB of
    # entries only to encode them again; the reader validates them anyway.
    def _freeze_lines(self, rollout_id: str) -> FrozenLines:
        """`_freeze`, keeping the entry lines as stored instead of parsing them."""
        data, state, incomplete = self._frozen(rollout_id, _read_indexed)
        lines = [line for line in data.split(b"\n") if line.strip()]
        if len(lines) > len(state.entry_digests):
            # A call re-sent by its writer may be stored twice, byte for byte: keep it once.
            lines = list(dict.fromkeys(lines))
        return FrozenLines(
            rollout_id=rollout_id,
            lines=tuple(lines),
            incomplete=incomplete,
            snapshot_id=str(state.snapshot_id),
            version=state.version,
        )

    async def freeze_lines(self, rollout_id: str) -> FrozenLines:
        """`freeze`, returning the entry lines unparsed (the store server's fast path)."""
        return await asyncio.to_thread(self._freeze_lines, rollout_id)

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        """Delete exactly that snapshot's data, keeping the state as a retired tombstone."""
        check_store_id(rollout_id)
        return await asyncio.to_thread(self._drop, rollout_id, snapshot_id, version)

    def _committed_entries(self, rollout_id: str) -> tuple[TokenEntry, ...]:
        paths = _Paths(self.directory, rollout_id)
        if not _exists(paths.state):
            return ()  # nothing acknowledged yet (and no lock file is created for a stranger)
        with self._locked(paths, exclusive=False):
            self._check_files(paths)
            state = self._read_state(paths)
            if state.retired:
                return ()
            # Only the indexed part: a line past it was never acknowledged to its writer.
            return self._read_entries(paths, state, rollout_id)

    async def committed_entries(self, rollout_id: str) -> tuple[TokenEntry, ...]:
        """The rollout's acknowledged entries in put order, read under the shared lock.

        Read-only (lineage resolution of a rollout still being written): no
        freeze, no tail indexing. A retired or unknown rollout has none.
        """
        check_store_id(rollout_id)
        return await asyncio.to_thread(self._committed_entries, rollout_id)

    # -- administration ----------------------------------------------------

    def status(self, rollout_id: str) -> dict[str, Any] | None:
        """The stored state of one rollout under a shared lock, or None when nothing is stored."""
        paths = _Paths(self.directory, rollout_id)
        if not _exists(paths.state) and not _exists(paths.jsonl):
            return None
        with self._locked(paths, exclusive=False):
            return self._read_state(paths).to_dict()

    def inspect(self, rollout_id: str) -> dict[str, Any] | None:
        """One capture as an operator needs to see it (read under a shared lock, nothing changes).

        None when no file of the rollout exists; CaptureCorrupt when one is not
        a regular file or the state does not parse.
        """
        paths = _Paths(self.directory, rollout_id)
        if not any(_exists(path) for path in paths.stored_files()):
            return None
        with self._locked(paths, exclusive=False):
            self._check_files(paths)
            state = self._read_state(paths)
            failed = sorted(set(_read_lines(paths.incomplete)))
            announced = set(_read_lines(paths.intents))
            sizes = {p.name: os.lstat(p).st_size for p in paths.stored_files() if _exists(p)}
        missing = sorted(announced - state.entry_digests.keys())
        reasons = []
        if state.incomplete:
            reasons.append("the capture was marked incomplete")
        if failed:
            reasons.append(f"{len(failed)} call(s) failed to capture")
        if missing:
            reasons.append(f"{len(missing)} announced call(s) have no entry")
        unindexed = sizes.get(paths.jsonl.name, 0) - state.indexed_size
        return {
            "rollout_id": rollout_id,
            "store": "file",
            "state": "retired" if state.retired else "frozen" if state.frozen else "open",
            "frozen": state.frozen,
            "retired": state.retired,
            "snapshot_id": state.snapshot_id,
            "version": state.version,
            "entries": len(state.entry_digests),
            "unindexed_bytes": max(unindexed, 0) if not state.retired else 0,
            "incomplete": bool(reasons),
            "incomplete_reasons": reasons,
            "incomplete_call_ids": failed,
            "missing_call_ids": missing,
            "announced_calls": len(announced),
            "files": sizes,
        }

    def _scan(self) -> tuple[set[str], dict[str, list[str]], list[SkippedFile]]:
        """One pass over the directory: rollout ids with any capture file, temp files by
        rollout id, and capture-like names that no rollout id can have (skipped)."""
        ids: set[str] = set()
        temps: dict[str, list[str]] = {}
        stray: list[SkippedFile] = []
        with os.scandir(self.directory) as listing:
            names = sorted(entry.name for entry in listing)
        for name in names:
            temp = _TEMP_NAME.fullmatch(name)
            suffix = next((s for s in _CAPTURE_SUFFIXES if name.endswith(s)), None)
            stem = temp.group(1) if temp else name[: -len(suffix)] if suffix else None
            if stem is None:
                continue  # not a capture file: none of the store's business
            try:
                check_store_id(stem)
            except InvalidRolloutId as exc:
                stray.append(SkippedFile(name, f"not a capture file of this store: {exc}"))
                continue
            if temp:
                temps.setdefault(stem, []).append(name)
            else:
                ids.add(stem)
        return ids, temps, stray

    def rollout_ids(self) -> list[str]:
        """Every rollout with a state file or a capture file in the directory.

        Names no rollout id can have (`notes about run 7.tokens.jsonl`) are not
        rollouts and are left out.
        """
        ids, _, _ = self._scan()
        found = []
        for rollout_id in ids:
            paths = _Paths(self.directory, rollout_id)
            if _exists(paths.state) or _exists(paths.jsonl):
                found.append(rollout_id)
        return sorted(found)

    def delete(self, rollout_id: str) -> list[str]:
        """Remove every file of one rollout, tombstone included (admin use only).

        Returns the names removed. A link or FIFO planted under one of the
        names is removed as a name (what it points to is untouched); a
        directory under one of the names raises CaptureCorrupt and is left.
        """
        paths = _Paths(self.directory, rollout_id)
        removed: list[str] = []
        had_lock = _exists(paths.lock)
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISREG(os.lstat(paths.lock).st_mode):
                # Nobody can hold a lock that is not a regular file: remove the name.
                os.unlink(paths.lock)
        with self._locked(paths, exclusive=True):
            for path in paths.stored_files():
                try:
                    path.unlink()
                except FileNotFoundError:
                    continue
                except IsADirectoryError:
                    raise _not_regular(path.name, "a directory") from None
                removed.append(path.name)
            paths.lock.unlink(missing_ok=True)
        return [*removed, paths.lock.name] if had_lock else removed

    def sweep(
        self,
        *,
        retired_older_than: float,
        abandoned_older_than: float | None = None,
        empty_older_than: float | None = None,
        dry_run: bool = False,
        now: float | None = None,
    ) -> list[SweptCapture]:
        """`sweep_report`'s removed captures; what it skipped is logged as warnings."""
        report = self.sweep_report(
            retired_older_than=retired_older_than,
            abandoned_older_than=abandoned_older_than,
            empty_older_than=empty_older_than,
            dry_run=dry_run,
            now=now,
        )
        for skipped in report.skipped:
            logger.warning(
                "sweep of %s skipped %r: %s", self.directory, skipped.name, skipped.reason
            )
        return list(report.captures)

    def sweep_report(
        self,
        *,
        retired_older_than: float,
        abandoned_older_than: float | None = None,
        empty_older_than: float | None = None,
        dry_run: bool = False,
        now: float | None = None,
    ) -> SweepReport:
        """Remove retired tombstones and, only when asked, quiet never-frozen or empty captures.

        Ages count from each capture's newest file. Removed: retired tombstones
        unchanged for `retired_older_than`; with `abandoned_older_than`, never
        frozen captures unchanged that long; with `empty_older_than`, frozen
        captures with nothing in them (no entry, no failed or announced call,
        not marked incomplete: what freezing a never-captured id leaves)
        unchanged that long. Also removed, whatever the thresholds: temporary
        state files and lone lock files older than STALE_FILE_AGE_S (left by
        killed writers) and the data files of retired captures (left by a drop
        interrupted after its tombstone). A frozen capture with anything in it
        that was not retired is evidence and is never touched.

        A name no rollout can have, or a capture whose files cannot be trusted
        (a planted link or FIFO, an unreadable state), is skipped and reported;
        the rest of the directory is swept all the same.
        """
        now = time.time() if now is None else now
        rules = _SweepRules(retired_older_than, abandoned_older_than, empty_older_than)
        ids, temps, skipped = self._scan()
        captures: list[SweptCapture] = []
        files: list[SweptFile] = []
        for rollout_id in sorted(ids | temps.keys()):
            try:
                capture, leftovers = self._sweep_one(
                    rollout_id, temps.get(rollout_id, []), rules, now, dry_run
                )
            except (CaptureError, OSError) as exc:
                skipped.append(SkippedFile(rollout_id, describe_exception(exc)))
                continue
            files.extend(leftovers)
            if capture is not None:
                captures.append(capture)
        return SweepReport(tuple(captures), tuple(files), tuple(skipped))

    def _sweep_one(
        self, rollout_id: str, temps: list[str], rules: _SweepRules, now: float, dry_run: bool
    ) -> tuple[SweptCapture | None, list[SweptFile]]:
        """Sweep one rollout under its exclusive lock: its capture and its leftover files."""
        paths = _Paths(self.directory, rollout_id)
        had_lock = _exists(paths.lock)
        leftovers: list[SweptFile] = []

        def remove(path: Path, reason: str, age: float) -> None:
            leftovers.append(SweptFile(path.name, reason, age))
            if not dry_run:
                path.unlink(missing_ok=True)

        with self._locked(paths, exclusive=True):
            # Under the lock no state write is under way: a temp file is dead.
            for name in temps:
                with contextlib.suppress(FileNotFoundError):
                    age = now - os.lstat(self.directory / name).st_mtime
                    if age >= STALE_FILE_AGE_S:
                        remove(self.directory / name, "temp", age)
            self._check_files(paths)
            stored = [path for path in paths.stored_files() if _exists(path)]
            if not stored:
                # A lone lock: an operation that stored nothing, or this sweep's own.
                age = now - os.lstat(paths.lock).st_mtime
                if not had_lock:
                    paths.lock.unlink(missing_ok=True)
                elif age >= STALE_FILE_AGE_S:
                    remove(paths.lock, "lock", age)
                return None, leftovers
            state = self._read_state(paths)
            age = now - max(os.lstat(path).st_mtime for path in stored)
            reason = rules.reason(state, age, lambda: self._holds_nothing(paths, state))
            if reason is None:
                if state.retired:
                    for path in paths.data_files():
                        with contextlib.suppress(FileNotFoundError):
                            remove(path, "orphan", now - os.lstat(path).st_mtime)
                return None, leftovers
            if not dry_run:
                for path in stored:
                    path.unlink(missing_ok=True)
                paths.lock.unlink(missing_ok=True)
            return SweptCapture(rollout_id, reason, age), leftovers

    @staticmethod
    def _holds_nothing(paths: _Paths, state: CaptureState) -> bool:
        """No entry, no incomplete mark, no announced or failed call id: nothing was captured."""
        if state.incomplete or state.entry_digests or state.indexed_size:
            return False
        return all(os.lstat(path).st_size == 0 for path in paths.data_files() if _exists(path))

    async def ping(self) -> None:
        """Reachable when the directory exists and is writable."""
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise OSError(f"capture directory {self.directory} is not writable")

    async def close(self) -> None:
        """Nothing to release: every operation opens and closes its own files."""
