"""External staging in the file store: the ledger and the staged calls of each rollout.

    R.lineage.jsonl   ledger rows, NeMo Gym's FileLineageStore format: one row per
                      line, sorted-key compact JSON, fsynced (the directory too when
                      the file is new), under the rollout's exclusive flock on
                      R.tokens.lock, the lock file Gym shares
    R.staged.jsonl    staged calls: {"attachments": ..., "packed_columns": ...,
                      "record": <StagedCallRecord without its columns>} per line
                      (docs/staging.md#packed-at-rest), sorted keys, fsynced before
                      a stage is acknowledged;
                      a clear rewrites it with each cleared call's line replaced by
                      the tombstone {"cleared": <call id>}

A directory Gym's own ledger wrote is read as it is, and Gym reads ours.
Every operation holds the rollout's exclusive flock (as Gym's ledger does),
so one thread of one process at a time reads or extends a rollout's files;
each process keeps, per rollout, the rows and staged-call positions it has
read and reads on from its last offset (`_tail`), so a write or a resolution
costs what it touches, not the rollout's size. The state file is written only
by the freeze: a staging rollout's version is its number of rows and staged
calls (each write bumps it by one), counted when it is frozen.
See docs/staging.md#storage.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

from token_finalizer._constants import STAGING_INDEX_MAX_ROLLOUTS
from token_finalizer.core.codec import loads_json
from token_finalizer.core.errors import CaptureConflict, CaptureCorrupt
from token_finalizer.core.identity import check_model_call_id, check_store_id
from token_finalizer.core.staging import (
    LedgerConflict,
    LedgerResolution,
    LedgerWrite,
    RolloutManifest,
    StagedCallBaseSnapshot,
    StagedCallRecord,
    StagingRecordError,
    check_custody,
    stored_snapshot,
)
from token_finalizer.sources._staging import (
    base_json_of,
    checked_attachments,
    checked_failure_row,
    checked_ledger_row,
    clear_refused,
    cleared_call_ids,
    cleared_conflict,
    file_line,
    ledger_line,
    parse_file_line,
    parse_staged_call,
    same_staged_line,
    staged_ancestors,
    staged_lines,
    staging_refused,
    staging_report,
)
from token_finalizer.sources._staging_index import LedgerIndex, StagedCallCache
from token_finalizer.sources._state import CaptureState
from token_finalizer.sources.base import (
    Attachment,
    LineageQuery,
    ParsedStagedCall,
    StagedExtras,
    StagedLines,
    StagingReport,
)
from token_finalizer.sources.file._capture import CaptureFiles
from token_finalizer.sources.file._fs import exists, fsync_dir, read_file
from token_finalizer.sources.file._tail import Tail, append_line, read_appended

__all__ = ["FileStaging"]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class _Slot:
    """Where one staged call's line is, and what the custody walk needs without reading it."""

    offset: int
    length: int
    digest: str
    parent_call_id: str | None


@dataclass(slots=True)
class _Read:
    """What this process has read of one rollout's ledger and staged-call files."""

    ledger_tail: Tail | None = None
    ledger: LedgerIndex = field(default_factory=LedgerIndex)
    staged_tail: Tail | None = None
    staged: dict[str, _Slot] = field(default_factory=dict)
    staged_lines: int = 0
    # Calls whose staged line a clear replaced by a tombstone (never staged again).
    cleared: set[str] = field(default_factory=set)


class FileStaging:
    """The StagingStore methods over one capture directory (and the freeze's staging half)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._reads: OrderedDict[str, _Read] = OrderedDict()
        self._reads_guard = threading.Lock()
        self._calls = StagedCallCache()

    def _files(self, rollout_id: str) -> CaptureFiles:
        return CaptureFiles(self.directory, rollout_id)

    # -- what this process has read, brought up to date ------------------------------

    def _read(self, rollout_id: str) -> _Read:
        with self._reads_guard:
            read = self._reads.get(rollout_id)
            if read is None:
                read = self._reads[rollout_id] = _Read()
                while len(self._reads) > STAGING_INDEX_MAX_ROLLOUTS:
                    self._reads.popitem(last=False)
            else:
                self._reads.move_to_end(rollout_id)
            return read

    def _current(self, files: CaptureFiles, rollout_id: str) -> _Read:
        """The rollout's rows and staged-call slots, read on to the files' ends (lock held)."""
        read = self._read(rollout_id)
        ledger = read_appended(files.ledger, read.ledger_tail)
        if ledger.restarted:
            read.ledger = LedgerIndex()
        for offset, line in ledger.lines:
            read.ledger.add(_row(files, line, offset))
        read.ledger_tail = ledger.tail
        staged = read_appended(files.staged, read.staged_tail)
        if staged.restarted:
            read.staged, read.staged_lines, read.cleared = {}, 0, set()
        for offset, line in staged.lines:
            read.staged_lines += 1
            cleared = _cleared_id(files, line, offset)
            if cleared is not None:
                read.staged.pop(cleared, None)
                read.cleared.add(cleared)
                continue
            call_id, slot = _slot(files, line, offset)
            read.staged.setdefault(call_id, slot)
        read.staged_tail = staged.tail
        return read

    # -- locking and the rollout's state -----------------------------------------------

    def _locked(
        self, rollout_id: str, work: Callable[[CaptureFiles, _Read], _T], *, writing: bool
    ) -> _T:
        """Run `work` under the rollout's exclusive flock with its files read on.

        A write first checks the state (frozen, retired) and the family guard.
        """
        files = self._files(rollout_id)
        with files.locked(exclusive=True):
            files.check_files()
            if writing:
                self._check_writable(files, rollout_id)
            return work(files, self._current(files, rollout_id))

    def _reading(self, rollout_id: str, work: Callable[[CaptureFiles, _Read], _T], empty: _T) -> _T:
        """`work` for a rollout that holds staging and was not retired, else `empty`."""
        files = self._files(rollout_id)
        if not files.holds_staging():
            return empty  # nothing to read, and no lock file is created for a stranger

        def read(files: CaptureFiles, current: _Read) -> _T:
            return empty if files.read_state().retired else work(files, current)

        return self._locked(rollout_id, read, writing=False)

    @staticmethod
    def _check_writable(files: CaptureFiles, rollout_id: str) -> None:
        state = files.read_state()
        state.check_writable(rollout_id)
        if state.entry_digests or state.incomplete or any(map(exists, files.token_files())):
            raise staging_refused(rollout_id)

    # -- the ledger ----------------------------------------------------------------------

    def _append_row(
        self, files: CaptureFiles, current: _Read, rollout_id: str, row: dict[str, Any]
    ) -> None:
        created = not exists(files.ledger)
        tail = append_line(files.ledger, ledger_line(row), current.ledger_tail)
        if created:
            fsync_dir(self.directory)
        if tail is None:  # the file was not where this process left it: read it again
            current.ledger_tail = None
            self._current(files, rollout_id)
            return
        current.ledger.add(row)
        current.ledger_tail = tail

    def _record_row(self, rollout_id: str, row: dict[str, Any]) -> bool:
        def write(files: CaptureFiles, current: _Read) -> bool:
            try:
                decision = current.ledger.plan_commit(row)
            except LedgerConflict as conflict:
                raise CaptureConflict(f"rollout {rollout_id}: {conflict}") from None
            if decision is LedgerWrite.REPLAY:
                return False
            self._append_row(files, current, rollout_id, row)
            return True

        return self._locked(rollout_id, write, writing=True)

    async def record_ledger_row(self, rollout_id: str, row: Mapping[str, Any]) -> bool:
        """Append a committed row durably (write-once); False for an identical replay."""
        checked = checked_ledger_row(row)
        return await asyncio.to_thread(self._record_row, check_store_id(rollout_id), checked)

    def _record_failure(self, rollout_id: str, row: dict[str, Any]) -> bool:
        def write(files: CaptureFiles, current: _Read) -> bool:
            if current.ledger.plan_failure(row) is LedgerWrite.REPLAY:
                return False
            self._append_row(files, current, rollout_id, row)
            return True

        return self._locked(rollout_id, write, writing=True)

    async def record_ledger_failure(self, rollout_id: str, model_call_id: str, reason: str) -> bool:
        """Append a failure row durably; False when that (call, reason) row is stored."""
        row = checked_failure_row(model_call_id, reason)
        return await asyncio.to_thread(self._record_failure, check_store_id(rollout_id), row)

    async def ledger_has_rows(self, rollout_id: str) -> bool:
        """Whether the rollout's ledger holds any row."""
        check_store_id(rollout_id)
        return await asyncio.to_thread(
            self._reading, rollout_id, lambda _, current: bool(current.ledger.rows), False
        )

    def _manifest(self, files: CaptureFiles, current: _Read, rollout_id: str) -> RolloutManifest:
        try:
            return current.ledger.manifest(rollout_id)
        except StagingRecordError as error:
            raise CaptureCorrupt(f"{files.ledger.name}: {error}") from None

    async def ledger_manifest(self, rollout_id: str) -> RolloutManifest:
        """The manifest of the rollout's ledger (CaptureCorrupt for a row Gym would refuse)."""
        empty = RolloutManifest(rollout_id=check_store_id(rollout_id))
        return await asyncio.to_thread(
            self._reading,
            rollout_id,
            lambda files, current: self._manifest(files, current, rollout_id),
            empty,
        )

    async def resolve_ledger(self, rollout_id: str, query: LineageQuery) -> LedgerResolution | None:
        """Resolution over the ledger rows of the request's fingerprint; None without rows."""
        check_store_id(rollout_id)

        def resolve(_: CaptureFiles, current: _Read) -> LedgerResolution | None:
            return current.ledger.resolve(query) if current.ledger.rows else None

        # Every resolve of the model server's hot path asks this first, and
        # almost every rollout holds no staging: two stats on the event loop
        # answer that without a worker-thread hop (docs/architecture.md#round-trips).
        if not self._files(rollout_id).holds_staging():
            return None
        return await asyncio.to_thread(self._reading, rollout_id, resolve, None)

    # -- staged calls --------------------------------------------------------------------

    def _snapshot(
        self, files: CaptureFiles, current: _Read, call_id: str
    ) -> StagedCallBaseSnapshot | None:
        """A staged call of the rollout, from this process's cache or read from its line."""
        slot = current.staged.get(call_id)
        if slot is None:
            return None
        cached = self._calls.get(slot.digest)
        if cached is not None:
            return cached
        record, _ = parse_file_line(_line(files, slot), files.staged.name)
        record.pop("extras", None)
        try:
            snapshot = stored_snapshot(record)
        except StagingRecordError as error:
            raise CaptureCorrupt(f"{files.staged.name}: staged call {call_id}: {error}") from None
        self._calls.put(snapshot)
        return snapshot

    def _stage(self, record: StagedCallRecord, line: bytes) -> bool:
        rollout_id, call_id = record.rollout_id, record.model_call_id

        def write(files: CaptureFiles, current: _Read) -> bool:
            slot = current.staged.get(call_id)
            if slot is not None and same_staged_line(_line(files, slot), line, files.staged.name):
                return False
            ancestors: list[StagedCallBaseSnapshot] = []
            if record.parent_call_id is not None:
                ancestors = staged_ancestors(
                    record.parent_call_id,
                    lambda ancestor: self._snapshot(files, current, ancestor),
                    len(current.staged),
                )
            check_custody(record, ancestors)
            if call_id in current.cleared:
                raise cleared_conflict(rollout_id, call_id)
            if slot is not None:
                raise CaptureConflict(
                    f"call {call_id} of rollout {rollout_id} was already staged "
                    "with a different payload"
                )
            created = not exists(files.staged)
            offset = current.staged_tail.offset if current.staged_tail is not None else 0
            tail = append_line(files.staged, line, current.staged_tail)
            if created:
                fsync_dir(self.directory)
            if tail is None:
                current.staged_tail = None
                self._current(files, rollout_id)
            else:
                current.staged[call_id] = _Slot(
                    offset, len(line), record.digest, record.parent_call_id
                )
                current.staged_lines += 1
                current.staged_tail = tail
            self._calls.put(record.base_snapshot())
            return True

        return self._locked(rollout_id, write, writing=True)

    async def stage(
        self, record: StagedCallRecord, attachments: Mapping[str, Attachment] | None = None
    ) -> bool:
        """Store a staged call durably after the custody checks; False for an identical replay."""
        check_store_id(record.rollout_id)
        check_model_call_id(record.model_call_id)
        line = file_line(record, checked_attachments(attachments))
        return await asyncio.to_thread(self._stage, record, line)

    def _staged_call(
        self, files: CaptureFiles, current: _Read, call_id: str
    ) -> ParsedStagedCall | None:
        """The call as staged, parsed (its columns as stored); None when not staged."""
        slot = current.staged.get(call_id)
        if slot is None:
            return None
        return parse_staged_call(_line(files, slot), files.staged.name)

    def _staged_json(self, files: CaptureFiles, current: _Read, call_id: str) -> bytes | None:
        slot = current.staged.get(call_id)
        if slot is None:
            return None
        record, _ = parse_file_line(_line(files, slot), files.staged.name)
        record.pop("extras", None)
        return base_json_of(record)

    async def fetch_staged(
        self, rollout_id: str, call_ids: Sequence[str]
    ) -> tuple[bytes | None, ...]:
        """Each call's base snapshot JSON, in order; None when not staged."""
        check_store_id(rollout_id)

        def fetch(files: CaptureFiles, current: _Read) -> tuple[bytes | None, ...]:
            return tuple(self._staged_json(files, current, call_id) for call_id in call_ids)

        empty = tuple(None for _ in call_ids)
        return await asyncio.to_thread(self._reading, rollout_id, fetch, empty)

    async def fetch_extras(self, rollout_id: str, call_ids: Sequence[str]) -> StagedExtras:
        """The extras of the staged calls among `call_ids`."""
        check_store_id(rollout_id)

        def fetch(files: CaptureFiles, current: _Read) -> StagedExtras:
            found: StagedExtras = {}
            for call_id in call_ids:
                slot = current.staged.get(call_id)
                if slot is not None:
                    line = _line(files, slot)
                    record, _ = parse_file_line(line, files.staged.name, columns=False)
                    found[call_id] = record.get("extras")
            return found

        return await asyncio.to_thread(self._reading, rollout_id, fetch, {})

    async def fetch_attachments(
        self, rollout_id: str, model_call_id: str
    ) -> dict[str, Attachment] | None:
        """The call's attachments ({} when it staged none); None when not staged."""
        check_store_id(rollout_id)

        def fetch(files: CaptureFiles, current: _Read) -> dict[str, Attachment] | None:
            slot = current.staged.get(model_call_id)
            if slot is None:
                return None
            _, attachments = parse_file_line(_line(files, slot), files.staged.name, columns=False)
            return dict(attachments or {})

        return await asyncio.to_thread(self._reading, rollout_id, fetch, None)

    def _clear(self, rollout_id: str, call_ids: list[str]) -> int:
        files = self._files(rollout_id)
        if not files.holds_staging():
            return 0  # nothing staged, and no lock file is created for a stranger

        def clear(files: CaptureFiles, current: _Read) -> int:
            state = files.read_state()
            if state.retired:
                return 0
            if state.frozen:
                raise clear_refused(rollout_id)
            staged = current.staged
            held = sorted(
                ((staged[call_id], call_id) for call_id in call_ids if call_id in staged),
                key=lambda pair: pair[0].offset,
            )
            if not held:
                return 0
            # Each cleared call's line becomes its tombstone, in place: the line count
            # (the open rollout's version) is unchanged, the tokens are gone.
            data = read_file(files.staged)
            if data is None:
                raise CaptureCorrupt(f"{files.staged.name} vanished under the rollout's lock")
            pieces: list[bytes] = []
            start = 0
            for slot, call_id in held:
                pieces += [data[start : slot.offset], _tombstone(call_id)]
                start = slot.offset + slot.length
            pieces.append(data[start:])
            files.replace_staged(b"".join(pieces))
            current.staged_tail = None  # another file now: read it again from its start
            self._current(files, rollout_id)
            return len(held)

        return self._locked(rollout_id, clear, writing=False)

    async def clear_staged(self, rollout_id: str, call_ids: Sequence[str]) -> int:
        """Delete exactly these staged calls; how many were held (idempotent)."""
        check_store_id(rollout_id)
        ids = cleared_call_ids(call_ids)
        if not ids:
            return 0
        return await asyncio.to_thread(self._clear, rollout_id, ids)

    # -- what the store's freeze, drop and admin call, under the rollout's lock ----------

    def write_count(self, files: CaptureFiles, rollout_id: str) -> int:
        """Rows plus staged calls: the version of an open staging rollout (lock held)."""
        current = self._current(files, rollout_id)
        return len(current.ledger) + current.staged_lines

    def frozen_lines(self, files: CaptureFiles, rollout_id: str) -> StagedLines:
        """The manifest and each record's staged base JSON (lock held)."""
        current = self._current(files, rollout_id)
        manifest = self._manifest(files, current, rollout_id)
        return staged_lines(manifest, lambda call_id: self._staged_call(files, current, call_id))

    def report(self, files: CaptureFiles, rollout_id: str) -> StagingReport:
        """What `store inspect` shows (lock held)."""
        current = self._current(files, rollout_id)
        return staging_report(current.ledger.rows, current.staged, len(current.cleared))

    def state_of(self, files: CaptureFiles, state: CaptureState, rollout_id: str) -> CaptureState:
        """`state` with the version an open staging rollout has (lock held)."""
        if files.holds_staging() and not state.frozen and not state.retired:
            state.version = self.write_count(files, rollout_id)
        return state


def _row(files: CaptureFiles, line: bytes, offset: int) -> dict[str, Any]:
    try:
        row = loads_json(line)
    except ValueError as error:
        raise CaptureCorrupt(
            f"{files.ledger.name}: unreadable row at byte {offset} ({error})"
        ) from None
    if not isinstance(row, dict):
        raise CaptureCorrupt(f"{files.ledger.name}: the row at byte {offset} is not an object")
    return row


_TOMBSTONE_START = b'{"cleared":'


def _tombstone(call_id: str) -> bytes:
    """The line a clear leaves in place of a staged call's (sorted keys, compact)."""
    return orjson.dumps({"cleared": call_id})


def _cleared_id(files: CaptureFiles, line: bytes, offset: int) -> str | None:
    """The call id of a tombstone line; None for a staged call's line."""
    if not line.startswith(_TOMBSTONE_START):
        return None
    try:
        data = loads_json(line)
    except ValueError as error:
        raise CaptureCorrupt(
            f"{files.staged.name} at byte {offset}: unreadable tombstone ({error})"
        ) from None
    call_id = data.get("cleared") if isinstance(data, dict) else None
    if not isinstance(call_id, str) or set(data) != {"cleared"}:
        raise CaptureCorrupt(f"{files.staged.name} at byte {offset}: a malformed tombstone")
    return call_id


def _slot(files: CaptureFiles, line: bytes, offset: int) -> tuple[str, _Slot]:
    where = f"{files.staged.name} at byte {offset}"
    record, _ = parse_file_line(line, where, columns=False)
    call_id, digest, parent = (
        record.get("model_call_id"),
        record.get("digest"),
        record.get("parent_call_id"),
    )
    if not isinstance(call_id, str) or not isinstance(digest, str):
        raise CaptureCorrupt(f"{where}: a staged call without model_call_id or digest")
    if parent is not None and not isinstance(parent, str):
        raise CaptureCorrupt(f"{where}: parent_call_id is not a string")
    return call_id, _Slot(offset, len(line), digest, parent)


def _line(files: CaptureFiles, slot: _Slot) -> bytes:
    data = read_file(files.staged, slot.length, offset=slot.offset)
    if data is None or len(data) != slot.length:
        raise CaptureCorrupt(f"{files.staged.name} is shorter than this process read it")
    return data
