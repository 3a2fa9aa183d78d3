"""One rollout's files in the capture directory: their names, their lock, their state file.

    R.tokens.jsonl        one TokenEntry per line, compact sorted-key JSON, fsynced per put
    R.tokens.state.json   CaptureState, replaced atomically (temp file + rename)
    R.tokens.lock         flock: exclusive for mutations, shared for plain reads
    R.tokens.intents      announced model call ids, one per line
    R.tokens.incomplete   model call ids that failed to capture, one per line
    R.lineage.jsonl       external staging: the capture ledger, one row per line
    R.staged.jsonl        external staging: the staged calls, one per line

The layout is NeMo Gym's own (docs/store-protocol.md#file-store,
docs/staging.md#storage), so either side can read what the other wrote. The
store and its admin both work on a rollout through `CaptureFiles`, always
under its lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson

from token_finalizer.core.errors import CaptureCorrupt
from token_finalizer.core.identity import check_store_id
from token_finalizer.sources._state import CaptureState
from token_finalizer.sources.file._fs import (
    exists,
    fsync_dir,
    not_regular,
    open_regular,
    read_file,
    space_error,
    write_all,
)

__all__ = ["CAPTURE_SUFFIXES", "TEMP_NAME", "CaptureFiles"]

_SUFFIX = ".tokens"
_LEDGER_SUFFIX = ".lineage.jsonl"
_STAGED_SUFFIX = ".staged.jsonl"
# Every name a capture file can have, longest first (".tokens.state.json" before ".json").
CAPTURE_SUFFIXES = (
    ".tokens.incomplete",
    ".tokens.state.json",
    _LEDGER_SUFFIX,
    _STAGED_SUFFIX,
    ".tokens.intents",
    ".tokens.jsonl",
    ".tokens.lock",
)
# The temporary file of a replacement: `.R.tokens.state.json.<uuid4 hex>.tmp` for the
# state, `.R.staged.jsonl.<uuid4 hex>.tmp` for the staged calls after a clear.
TEMP_NAME = re.compile(
    r"\.(.+)\.(?:tokens\.state\.json|staged\.jsonl)\.[0-9a-f]{32}\.tmp", re.ASCII | re.DOTALL
)


class CaptureFiles:
    """The files of rollout `rollout_id` in `directory` (the id is checked first)."""

    __slots__ = (
        "directory",
        "incomplete",
        "intents",
        "jsonl",
        "ledger",
        "lock",
        "staged",
        "state",
    )

    def __init__(self, directory: Path, rollout_id: str) -> None:
        self.directory = directory
        rollout_id = check_store_id(rollout_id)
        stem = directory / f"{rollout_id}{_SUFFIX}"
        self.jsonl = stem.with_name(stem.name + ".jsonl")
        self.state = stem.with_name(stem.name + ".state.json")
        self.lock = stem.with_name(stem.name + ".lock")
        self.intents = stem.with_name(stem.name + ".intents")
        self.incomplete = stem.with_name(stem.name + ".incomplete")
        self.ledger = directory / f"{rollout_id}{_LEDGER_SUFFIX}"
        self.staged = directory / f"{rollout_id}{_STAGED_SUFFIX}"

    def data_files(self) -> tuple[Path, ...]:
        """What a drop removes: entries, announced and failed call ids, ledger, staged calls."""
        return (self.jsonl, self.intents, self.incomplete, self.ledger, self.staged)

    def token_files(self) -> tuple[Path, ...]:
        """The data files of token capture (a rollout holding any of them is not staging)."""
        return (self.jsonl, self.intents, self.incomplete)

    def holds_staging(self) -> bool:
        """Whether the rollout holds a ledger or staged calls (NeMo Gym's external staging)."""
        return exists(self.ledger) or exists(self.staged)

    def stored_files(self) -> tuple[Path, ...]:
        """Every file of the rollout but its lock."""
        return (*self.data_files(), self.state)

    def any_stored(self) -> bool:
        """Whether any file of the rollout (but the lock) exists."""
        return any(exists(path) for path in self.stored_files())

    @contextlib.contextmanager
    def locked(self, *, exclusive: bool, blocking: bool = True) -> Iterator[bool]:
        """Hold the rollout's flock; retry if a sweep unlinked the lock file meanwhile.

        With `blocking=False`, yields False at once (holding nothing) when the
        lock is taken in a conflicting mode, instead of waiting; else True.
        """
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        while True:
            fd = open_regular(self.lock, os.O_RDWR | os.O_CREAT, writing=True)
            try:
                try:
                    fcntl.flock(fd, mode if blocking else mode | fcntl.LOCK_NB)
                except BlockingIOError:
                    yield False
                    return
                held = os.fstat(fd)
                try:
                    named = os.lstat(self.lock)
                    same = (held.st_ino, held.st_dev) == (named.st_ino, named.st_dev)
                except FileNotFoundError:
                    same = False
                if same:
                    yield True
                    return
            finally:
                os.close(fd)  # closing releases the flock

    def check_files(self) -> None:
        """CaptureCorrupt unless every stored file of the rollout is absent or a regular file.

        Checked under the lock by every operation, so a link or FIFO planted
        under any of the names (even one this operation would not open)
        refuses the capture as a whole; each open checks again (O_NOFOLLOW).
        """
        for path in self.stored_files():
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(mode):
                raise not_regular(path.name, mode)

    def read_state(self) -> CaptureState:
        """The state file's content (a fresh state when there is none)."""
        raw = read_file(self.state)
        if raw is None:
            return CaptureState()
        try:
            return CaptureState.from_dict(orjson.loads(raw))
        except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError) as exc:
            raise CaptureCorrupt(f"{self.state.name} is not a valid state file: {exc}") from None

    def write_state(
        self,
        state: CaptureState,
        *,
        undo: Callable[[], None] | None = None,
        durable: bool = True,
    ) -> None:
        """Replace the state file atomically; `undo` runs if the old state stays in place.

        `durable=False` skips both fsyncs (the temporary file's and the
        directory's): only for a state whose changes the jsonl itself can
        rebuild, i.e. a put's entry digest and indexed size. The replacement is
        still atomic; after a crash the old state may come back, and the next
        locked operation indexes the fsynced lines past it again.
        """
        self._replace_atomically(
            self.state, orjson.dumps(state.to_dict()), durable=durable, undo=undo
        )

    def replace_staged(self, data: bytes) -> None:
        """Replace the staged-call file with `data` atomically and durably (temp file + rename).

        A clear rewrites it (docs/staging.md#clearing-staged-calls): the old
        file stays whole until the rename, so a crash leaves one or the other.
        """
        self._replace_atomically(self.staged, data, durable=True, undo=None)

    def _replace_atomically(
        self,
        target: Path,
        data: bytes,
        *,
        durable: bool,
        undo: Callable[[], None] | None,
    ) -> None:
        """Write `data` to a temporary file beside `target` and rename it over `target`.

        `undo` runs when the rename did not happen (the old file stays in
        place); `durable` fsyncs the file and then the directory.
        """
        temp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        created = False
        try:
            try:
                fd = open_regular(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, writing=True)
                created = True
                try:
                    write_all(fd, data)
                    if durable:
                        os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(temp, target)
            except BaseException as exc:
                if undo is not None:
                    undo()
                full = space_error(target.name, exc)
                if full is not None:
                    raise full from None
                raise
        finally:
            if created:
                temp.unlink(missing_ok=True)
        if durable:
            fsync_dir(self.directory)

    def remove_data_files(self) -> list[str]:
        """Unlink the rollout's data files (names only: a link's target is untouched)."""
        removed = []
        for path in self.data_files():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path.name)
        return removed
