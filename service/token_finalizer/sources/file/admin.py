"""The file store's admin: status, inspect, delete, sweep and listing of one directory.

Every method takes the rollout's lock (shared to read, exclusive to remove),
so it is safe beside live writers and finalizers on the same directory.
A name no rollout can have, or a capture whose files cannot be trusted (a
planted link or FIFO, an unreadable state), is skipped and reported by a
sweep; the rest of the directory is swept all the same.
See docs/store-protocol.md#sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from token_finalizer._constants import FILE_STALE_AGE_S
from token_finalizer.core.errors import CaptureError, InvalidRolloutId, describe_exception
from token_finalizer.core.identity import check_store_id
from token_finalizer.sources._state import CaptureState
from token_finalizer.sources.base import (
    CaptureReport,
    Skipped,
    SweepReport,
    SweepRules,
    SweptCapture,
    SweptLeftover,
)
from token_finalizer.sources.file._capture import CAPTURE_SUFFIXES, TEMP_NAME, CaptureFiles
from token_finalizer.sources.file._fs import exists, not_regular, read_id_lines
from token_finalizer.sources.file.staging import FileStaging

__all__ = ["FileStoreAdmin"]


def _holds_nothing(files: CaptureFiles, state: CaptureState) -> bool:
    """No entry, no incomplete mark, no announced or failed call id: nothing was captured."""
    if state.incomplete or state.entry_digests or state.indexed_size:
        return False
    return all(os.lstat(path).st_size == 0 for path in files.data_files() if exists(path))


def _holds_capture(files: CaptureFiles) -> bool:
    """A state file, token entries, a ledger or staged calls: a rollout of this store."""
    return exists(files.state) or exists(files.jsonl) or files.holds_staging()


class FileStoreAdmin:
    """StoreAdmin over one capture directory (its staging read through `staging`)."""

    def __init__(
        self,
        directory: Path,
        staging: FileStaging,
        on_removed: Callable[[str], None] | None = None,
    ) -> None:
        self.directory = directory
        self._staging = staging
        # Told the id of each capture this admin removes (the store drops its index).
        self._on_removed = on_removed or (lambda rollout_id: None)

    def _files(self, rollout_id: str) -> CaptureFiles:
        return CaptureFiles(self.directory, rollout_id)

    # -- reading -------------------------------------------------------------

    def _status(self, rollout_id: str) -> CaptureState | None:
        files = self._files(rollout_id)
        if not _holds_capture(files):
            return None
        if files.holds_staging():
            # The staging index is read on under the exclusive lock only.
            with files.locked(exclusive=True):
                return self._staging.state_of(files, files.read_state(), rollout_id)
        with files.locked(exclusive=False):
            return files.read_state()

    async def status(self, rollout_id: str) -> CaptureState | None:
        """The stored state of one rollout under a shared lock, or None when nothing is stored."""
        return await asyncio.to_thread(self._status, rollout_id)

    def _inspect(self, rollout_id: str) -> CaptureReport | None:
        files = self._files(rollout_id)
        if not files.any_stored():
            return None
        staging = files.holds_staging()
        with files.locked(exclusive=staging):
            files.check_files()
            state = files.read_state()
            failed = sorted(set(read_id_lines(files.incomplete)))
            announced = set(read_id_lines(files.intents))
            sizes = {p.name: os.lstat(p).st_size for p in files.stored_files() if exists(p)}
            report = None
            if staging:
                state = self._staging.state_of(files, state, rollout_id)
                report = self._staging.report(files, rollout_id)
        unindexed = sizes.get(files.jsonl.name, 0) - state.indexed_size
        return CaptureReport.of_state(
            rollout_id,
            "file",
            state,
            entries=len(state.entry_digests),
            incomplete_call_ids=tuple(failed),
            missing_call_ids=tuple(sorted(announced - state.entry_digests.keys())),
            announced_calls=len(announced),
            details={
                "unindexed_bytes": max(unindexed, 0) if not state.retired else 0,
                "files": sizes,
            },
            staging=report,
        )

    async def inspect(self, rollout_id: str) -> CaptureReport | None:
        """One capture's report (read under a shared lock; nothing changes).

        None when no file of the rollout exists; CaptureCorrupt when one is not
        a regular file or the state does not parse.
        """
        check_store_id(rollout_id)
        return await asyncio.to_thread(self._inspect, rollout_id)

    def _scan(self) -> tuple[set[str], dict[str, list[str]], list[Skipped]]:
        """One pass over the directory: rollout ids with any capture file, temp files by
        rollout id, and capture-like names that no rollout id can have (skipped)."""
        ids: set[str] = set()
        temps: dict[str, list[str]] = {}
        stray: list[Skipped] = []
        with os.scandir(self.directory) as listing:
            names = sorted(entry.name for entry in listing)
        for name in names:
            temp = TEMP_NAME.fullmatch(name)
            suffix = next((s for s in CAPTURE_SUFFIXES if name.endswith(s)), None)
            stem = temp.group(1) if temp else name[: -len(suffix)] if suffix else None
            if stem is None:
                continue  # not a capture file: none of the store's business
            try:
                check_store_id(stem)
            except InvalidRolloutId as exc:
                stray.append(Skipped(name, f"not a capture file of this store: {exc}"))
                continue
            if temp:
                temps.setdefault(stem, []).append(name)
            else:
                ids.add(stem)
        return ids, temps, stray

    def _rollout_ids(self) -> list[str]:
        ids, _, _ = self._scan()
        found = []
        for rollout_id in ids:
            if _holds_capture(self._files(rollout_id)):
                found.append(rollout_id)
        return sorted(found)

    async def rollout_ids(self) -> list[str]:
        """Every rollout with a state file, entries, a ledger or staged calls in the directory.

        Names no rollout id can have (`notes about run 7.tokens.jsonl`) are not
        rollouts and are left out.
        """
        return await asyncio.to_thread(self._rollout_ids)

    # -- removing -------------------------------------------------------------

    def _delete(self, rollout_id: str) -> tuple[str, ...]:
        files = self._files(rollout_id)
        removed: list[str] = []
        had_lock = exists(files.lock)
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISREG(os.lstat(files.lock).st_mode):
                # Nobody can hold a lock that is not a regular file: remove the name.
                os.unlink(files.lock)
        with files.locked(exclusive=True):
            for path in files.stored_files():
                try:
                    path.unlink()
                except FileNotFoundError:
                    continue
                except IsADirectoryError:
                    raise not_regular(path.name, what="a directory") from None
                removed.append(path.name)
            files.lock.unlink(missing_ok=True)
        self._on_removed(rollout_id)
        return (*removed, files.lock.name) if had_lock else tuple(removed)

    async def delete(self, rollout_id: str) -> tuple[str, ...]:
        """Remove every file of one rollout, tombstone included; the file names removed.

        A link or FIFO planted under one of the names is removed as a name
        (what it points to is untouched); a directory under one of the names
        raises CaptureCorrupt and is left.
        """
        check_store_id(rollout_id)
        return await asyncio.to_thread(self._delete, rollout_id)

    def _sweep(self, rules: SweepRules, dry_run: bool, now: float) -> SweepReport:
        ids, temps, skipped = self._scan()
        captures: list[SweptCapture] = []
        leftovers: list[SweptLeftover] = []
        for rollout_id in sorted(ids | temps.keys()):
            try:
                capture = self._sweep_one(
                    rollout_id, temps.get(rollout_id, []), rules, now, dry_run, leftovers
                )
            except (CaptureError, OSError) as exc:
                skipped.append(Skipped(rollout_id, describe_exception(exc)))
                continue
            if capture is not None:
                captures.append(capture)
        return SweepReport(tuple(captures), tuple(leftovers), tuple(skipped))

    async def sweep(
        self, rules: SweepRules, *, dry_run: bool = False, now: float | None = None
    ) -> SweepReport:
        """Remove what `rules` select; also stale files left by killed writers.

        Ages count from each capture's newest file. Whatever the rules, also
        removed: temporary state files and lone lock files older than
        FILE_STALE_AGE_S, and the data files of retired captures (left by a
        drop interrupted after its tombstone).
        """
        clock = time.time() if now is None else now
        return await asyncio.to_thread(self._sweep, rules, dry_run, clock)

    def _sweep_one(
        self,
        rollout_id: str,
        temps: list[str],
        rules: SweepRules,
        now: float,
        dry_run: bool,
        leftovers: list[SweptLeftover],
    ) -> SweptCapture | None:
        """Sweep one rollout under its exclusive lock: its capture and its leftover files."""
        files = self._files(rollout_id)
        had_lock = exists(files.lock)

        def remove(path: Path, reason: str, age: float) -> None:
            leftovers.append(SweptLeftover(path.name, reason, age))
            if not dry_run:
                path.unlink(missing_ok=True)

        with files.locked(exclusive=True):
            # Under the lock no state write is under way: a temp file is dead.
            for name in temps:
                with contextlib.suppress(FileNotFoundError):
                    age = now - os.lstat(self.directory / name).st_mtime
                    if age >= FILE_STALE_AGE_S:
                        remove(self.directory / name, "temp", age)
            files.check_files()
            stored = [path for path in files.stored_files() if exists(path)]
            if not stored:
                # A lone lock: an operation that stored nothing, or this sweep's own.
                age = now - os.lstat(files.lock).st_mtime
                if not had_lock:
                    files.lock.unlink(missing_ok=True)
                elif age >= FILE_STALE_AGE_S:
                    remove(files.lock, "lock", age)
                return None
            state = files.read_state()
            age = now - max(os.lstat(path).st_mtime for path in stored)
            reason = rules.reason(
                state, age, holds_nothing=state.frozen and _holds_nothing(files, state)
            )
            if reason is None:
                if state.retired:
                    for path in files.data_files():
                        with contextlib.suppress(FileNotFoundError):
                            remove(path, "orphan", now - os.lstat(path).st_mtime)
                return None
            if not dry_run:
                for path in stored:
                    path.unlink(missing_ok=True)
                files.lock.unlink(missing_ok=True)
                self._on_removed(rollout_id)
            return SweptCapture(rollout_id, reason, age)
