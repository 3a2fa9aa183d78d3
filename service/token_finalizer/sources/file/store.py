"""The file capture store: one directory shared by writers and the finalizer.

Every public method is async and runs its blocking file work in a thread;
each works on one rollout's files (`CaptureFiles`) under the rollout's flock.
The on-disk layout is NeMo Gym's (docs/store-protocol.md#file-store); the
operator's side (inspect, delete, sweep) is `FileStoreAdmin`, reached as
`store.admin`. External staging (the ledger and the staged calls) is
`FileStaging` (`staging.py`); a rollout holds one family or the other.
"""

from __future__ import annotations

import asyncio
import os
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from token_finalizer._constants import LINEAGE_CACHE_MAX_TOKENS, LINEAGE_INDEX_MAX_ROLLOUTS
from token_finalizer.core.codec import loads_json
from token_finalizer.core.entries import Snapshot, TokenEntry
from token_finalizer.core.errors import CaptureConflict, CaptureCorrupt, StoreUnreachable
from token_finalizer.core.identity import check_model_call_id, check_new_store_id, check_store_id
from token_finalizer.core.lineage_chains import ChainCache
from token_finalizer.core.lineage_index import EMPTY_LINEAGE
from token_finalizer.core.lineage_resolution import Resolution, check_resolution_request
from token_finalizer.core.token_ids import Ids
from token_finalizer.sources._entries import entry_parts, same_payload
from token_finalizer.sources._known import KnownIds
from token_finalizer.sources._lineage import resolve_query
from token_finalizer.sources._packed import (
    FILE_MARKER,
    RolloutIds,
    expand_lines,
    file_line,
    from_file_line,
    record_call,
    stored_value,
)
from token_finalizer.sources._staging import entries_refused, staged_capture
from token_finalizer.sources._staging_delegate import StagingDelegate
from token_finalizer.sources._state import CaptureState, PutDecision, line_digest
from token_finalizer.sources._stored import stored_entries
from token_finalizer.sources.base import FrozenLines, LineageQuery, MemoryHealth, StagedLines
from token_finalizer.sources.file._capture import CaptureFiles
from token_finalizer.sources.file._fs import (
    append_durably,
    exists,
    open_regular,
    read_file,
    read_id_lines,
    split_lines,
    truncate,
)
from token_finalizer.sources.file._index import FileLineageIndexes
from token_finalizer.sources.file.admin import FileStoreAdmin
from token_finalizer.sources.file.staging import FileStaging

__all__ = ["FileTokenStore"]

_Content = TypeVar("_Content")


def _read_indexed(files: CaptureFiles, state: CaptureState) -> bytes:
    """The indexed part of the jsonl file (nothing past the last acknowledged line)."""
    return read_file(files.jsonl, state.indexed_size) or b""


def _shorter(files: CaptureFiles, size: int, state: CaptureState) -> CaptureCorrupt:
    return CaptureCorrupt(
        f"{files.jsonl.name} is shorter ({size} bytes) than its index ({state.indexed_size} bytes)"
    )


def _cut_torn_tail(files: CaptureFiles, read: os.stat_result, offset: int) -> None:
    """Truncate the jsonl at `offset`: the very file that was read, never another."""
    fd = open_regular(files.jsonl, os.O_WRONLY, writing=True)
    try:
        now = os.fstat(fd)
        if (now.st_ino, now.st_dev) != (read.st_ino, read.st_dev):
            raise CaptureCorrupt(f"{files.jsonl.name} was replaced while it was being indexed")
        os.ftruncate(fd, offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def _line_call(line: bytes) -> tuple[str, str]:
    """The call id of one jsonl line and the digest of its canonical line."""
    if line.startswith(FILE_MARKER):
        return record_call(from_file_line(line))
    return loads_json(line)["model_call_id"], line_digest(line)


def _index_line(files: CaptureFiles, state: CaptureState, line: bytes, offset: int) -> None:
    try:
        call_id, digest = _line_call(line)
        check_model_call_id(call_id)
    except (ValueError, TypeError, KeyError, CaptureCorrupt) as exc:
        raise CaptureCorrupt(
            f"{files.jsonl.name}: unreadable line at byte {offset} followed by more data "
            f"({type(exc).__name__}: {exc})"
        ) from None
    if state.decide_put(call_id, digest) is PutDecision.CONFLICT:
        raise CaptureCorrupt(f"{files.jsonl.name}: two different lines for model call {call_id}")
    state.entry_digests[call_id] = digest


def _index_tail(files: CaptureFiles, state: CaptureState) -> bool:
    """Index jsonl lines written after the last state update; cut a torn final line.

    A writer that crashed after its append but before its state update leaves
    a complete line behind (indexed here); one that crashed mid-line leaves a
    torn tail that was never acknowledged (cut off here). A retired tombstone
    has no data files left to index. True when the state changed.
    """
    if state.retired:
        return False
    try:
        handle = os.fdopen(open_regular(files.jsonl, os.O_RDONLY), "rb")
    except FileNotFoundError:
        if state.indexed_size:
            raise _shorter(files, 0, state) from None
        return False
    with handle:
        read = os.fstat(handle.fileno())
        if read.st_size == state.indexed_size:
            return False
        if read.st_size < state.indexed_size:
            raise _shorter(files, read.st_size, state)
        handle.seek(state.indexed_size)
        *lines, torn = handle.read().split(b"\n")
    offset = state.indexed_size
    for line in lines:
        if line.strip():
            _index_line(files, state, line, offset)
        offset += len(line) + 1
    if torn:
        _cut_torn_tail(files, read, offset)
    state.indexed_size = offset
    state.version += 1
    return True


def _stored_line(files: CaptureFiles, model_call_id: str) -> bytes | None:
    """The canonical line of the call's first stored copy (the conflict path: reads all)."""
    known = RolloutIds()
    with os.fdopen(open_regular(files.jsonl, os.O_RDONLY), "rb") as handle:
        for line in handle:
            line = line.rstrip(b"\n")
            if not line:
                continue
            canonical = known.expand(from_file_line(line))
            if _line_call(line)[0] == model_call_id:
                return canonical
    return None


def _canonical_lines(data: bytes) -> tuple[bytes, ...]:
    """The canonical lines of the jsonl's indexed part (packed lines expanded)."""
    return expand_lines(from_file_line(line) for line in split_lines(data))


def _read_entries(
    files: CaptureFiles, state: CaptureState, rollout_id: str
) -> tuple[TokenEntry, ...]:
    # One read of the indexed part, then one slice per line: a long rollout's
    # capture is hundreds of MB, and buffered line reads plus newline
    # stripping would copy every line two more times.
    data = _read_indexed(files, state)
    values = (from_file_line(line) for line in split_lines(data))
    return stored_entries(values, rollout_id, files.jsonl.name)


def _frozen_lines(files: CaptureFiles, state: CaptureState) -> tuple[bytes, ...]:
    # A line stored twice (a relay re-sending it) goes out twice, as a direct
    # freeze reads it: NeMo Gym 0.7 counts both in `n_calls`.
    return _canonical_lines(_read_indexed(files, state))


def _frozen_values(files: CaptureFiles, state: CaptureState) -> tuple[bytes, ...]:
    """The indexed part's stored values (packed records decoded from their lines)."""
    return tuple(
        from_file_line(line) for line in split_lines(_read_indexed(files, state)) if line.strip()
    )


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return (info.st_dev, info.st_ino)


def _check_entries_writable(files: CaptureFiles, state: CaptureState, rollout_id: str) -> None:
    """A token-capture write: refused once frozen or retired, and for a staging rollout."""
    state.check_writable(rollout_id)
    if files.holds_staging():
        raise entries_refused(rollout_id)


def _check_one_family(files: CaptureFiles, rollout_id: str) -> None:
    """CaptureCorrupt when a staging rollout also holds token-capture files.

    Another writer sharing the directory (NeMo Gym's own file store) may have
    written `R.tokens.jsonl`: a finalize would verify only the staged calls,
    and retire would delete the rest unexamined. Masked, everything kept
    (docs/staging.md#storage, issue 29).
    """
    token_files = [path.name for path in files.token_files() if exists(path)]
    if token_files:
        staging = [path.name for path in (files.ledger, files.staged) if exists(path)]
        raise CaptureCorrupt(
            f"rollout {rollout_id} holds both token-capture files ({', '.join(token_files)}) "
            f"and staging files ({', '.join(staging)}); nothing was finalized or removed"
        )


class FileTokenStore(StagingDelegate):
    """CaptureStore over a local directory (created if missing)."""

    kind = "file"
    _staging: FileStaging

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._staging = FileStaging(self.directory)
        self._indexes = FileLineageIndexes(
            LINEAGE_INDEX_MAX_ROLLOUTS, ChainCache(LINEAGE_CACHE_MAX_TOKENS)
        )
        self._known = KnownIds(LINEAGE_INDEX_MAX_ROLLOUTS)
        self._admin = FileStoreAdmin(self.directory, self._staging, on_removed=self._forget)

    def _forget(self, rollout_id: str) -> None:
        self._indexes.forget(rollout_id)
        self._known.forget(rollout_id)

    def __repr__(self) -> str:
        return f"FileTokenStore({str(self.directory)!r})"

    @property
    def store_option(self) -> str:
        """`--dir PATH`: this store to `token-finalizer store` (hints name it).

        PATH as the store was opened with it: a finalizer's configured `dir`,
        relative to where the finalizer runs when it is relative (`--dir capture`
        for the embedded default), as an operator beside it types it.
        """
        return f"--dir {shlex.quote(str(self.directory))}"

    @property
    def admin(self) -> FileStoreAdmin:
        """Inspect, delete and sweep this directory."""
        return self._admin

    def _files(self, rollout_id: str) -> CaptureFiles:
        return CaptureFiles(self.directory, rollout_id)

    # -- writer side -------------------------------------------------------

    def _put(self, entry: object) -> None:
        parsed, line, payload = entry_parts(entry)
        files = self._files(parsed.rollout_id)
        digest = line_digest(line)
        with files.locked(exclusive=True):
            files.check_files()
            state = files.read_state()
            if _index_tail(files, state):
                files.write_state(state, durable=False)  # rebuilt from the jsonl alike
            _check_entries_writable(files, state, parsed.rollout_id)
            decision = state.decide_put(parsed.model_call_id, digest)
            if decision is PutDecision.CONFLICT:
                # Another serializer may have written the same payload with other bytes.
                stored = _stored_line(files, parsed.model_call_id)
                if stored is not None and same_payload(stored, line):
                    return
                self._mark_incomplete_locked(files, state, parsed.rollout_id, parsed.model_call_id)
                raise CaptureConflict(
                    f"model call {parsed.model_call_id} of rollout {parsed.rollout_id} "
                    "was already stored with a different payload"
                )
            if decision is PutDecision.SAME:
                return
            identity = _identity(files.jsonl)
            known = self._known.for_put(parsed.rollout_id, identity, state.entry_digests, parsed)
            try:
                value, _ = stored_value(payload, line, digest, parsed, known.ids)
                stored = line if value is line else file_line(value)
                start = append_durably(files.jsonl, stored + b"\n")
                state.record_put(parsed.model_call_id, digest)
                state.indexed_size += len(stored) + 1
                # If the state cannot be written (disk full), the line goes again:
                # the put failed, and the capture stays exactly as it was. The
                # fsynced line is the durable record; the state only indexes it and
                # is rebuilt from the jsonl after a crash, so it is not fsynced
                # (docs/store-protocol.md#crash-recovery).
                files.write_state(state, undo=lambda: truncate(files.jsonl, start), durable=False)
            except BaseException:
                self._known.forget(parsed.rollout_id)  # it learnt a call that is not stored
                raise
            written = os.stat(files.jsonl, follow_symlinks=False)
            identity = (written.st_dev, written.st_ino)
            known.stored(identity, parsed.model_call_id, digest)
            self._indexes.committed(
                parsed.rollout_id, identity, stored, value, start, parsed, digest
            )

    @staticmethod
    def _mark_incomplete_locked(
        files: CaptureFiles, state: CaptureState, rollout_id: str, model_call_id: str
    ) -> None:
        state.mark_incomplete(rollout_id)
        if model_call_id:
            # Kept even if the state write below fails: a freeze also counts
            # the ids in this file, so the mark is not lost to a full disk.
            append_durably(files.incomplete, model_call_id.encode() + b"\n")
        files.write_state(state)

    def _mark_incomplete(self, rollout_id: str, model_call_id: str) -> None:
        files = self._files(check_new_store_id(rollout_id))
        if model_call_id:
            check_model_call_id(model_call_id)
        with files.locked(exclusive=True):
            files.check_files()
            if files.holds_staging():
                raise entries_refused(rollout_id)
            state = files.read_state()
            _index_tail(files, state)
            self._mark_incomplete_locked(files, state, rollout_id, model_call_id)

    def _begin_call(self, rollout_id: str, model_call_id: str) -> None:
        files = self._files(check_new_store_id(rollout_id))
        check_model_call_id(model_call_id)
        with files.locked(exclusive=True):
            files.check_files()
            _check_entries_writable(files, files.read_state(), rollout_id)
            append_durably(files.intents, model_call_id.encode() + b"\n")

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

    def _frozen(
        self, rollout_id: str, read: Callable[[CaptureFiles, CaptureState], _Content]
    ) -> tuple[_Content | StagedLines, CaptureState, bool]:
        """Freeze (idempotent) and `read` the capture inside the same critical section.

        Returns what `read` returned (a staging rollout's manifest and staged
        calls instead), the frozen state, and whether the snapshot is
        incomplete (a call marked failed, or announced and missing).
        """
        files = self._files(rollout_id)
        with files.locked(exclusive=True):
            files.check_files()
            state = files.read_state()
            if files.holds_staging():
                _check_one_family(files, rollout_id)
                return self._frozen_staging(files, state, rollout_id), state, False
            changed = _index_tail(files, state)
            try:
                changed = state.freeze(rollout_id) or changed
            finally:
                if changed:
                    files.write_state(state)
            content = read(files, state)
            missing = set(read_id_lines(files.intents)) - state.entry_digests.keys()
            # An id in the incomplete file counts even if its state write failed.
            failed = bool(read_id_lines(files.incomplete))
        return content, state, state.incomplete or failed or bool(missing)

    def _frozen_staging(
        self, files: CaptureFiles, state: CaptureState, rollout_id: str
    ) -> StagedLines:
        """Freeze a staging rollout: its version counts every row and staged call (lock held)."""
        if not state.frozen and not state.retired:
            state.version = self._staging.write_count(files, rollout_id)
        if state.freeze(rollout_id):
            files.write_state(state)
        return self._staging.frozen_lines(files, rollout_id)

    def _freeze(self, rollout_id: str) -> Snapshot:
        entries, state, incomplete = self._frozen(
            rollout_id, lambda files, state: _read_entries(files, state, rollout_id)
        )
        staged = staged_capture(entries, rollout_id) if isinstance(entries, StagedLines) else None
        return Snapshot(
            rollout_id=rollout_id,
            entries=() if isinstance(entries, StagedLines) else entries,
            incomplete=incomplete,
            snapshot_id=str(state.snapshot_id),
            version=state.version,
            staged=staged,
        )

    def _freeze_lines(self, rollout_id: str, stored: bool) -> FrozenLines:
        lines, state, incomplete = self._frozen(
            rollout_id, _frozen_values if stored else _frozen_lines
        )
        staged = lines if isinstance(lines, StagedLines) else None
        return FrozenLines(
            rollout_id=rollout_id,
            lines=() if isinstance(lines, StagedLines) else lines,
            incomplete=incomplete,
            snapshot_id=str(state.snapshot_id),
            version=state.version,
            staged=staged,
        )

    async def freeze(self, rollout_id: str) -> Snapshot:
        """Freeze (idempotent) and read the rollout's immutable snapshot."""
        return await asyncio.to_thread(self._freeze, rollout_id)

    async def freeze_lines(self, rollout_id: str, *, stored: bool = False) -> FrozenLines:
        """`freeze`, returning the entry lines unparsed (the store server's fast path);
        `stored`: the values as stored, packed records decoded from their lines.

        A remote freeze must not parse 30 MB of entries only to encode them
        again; the reader validates them anyway.
        """
        return await asyncio.to_thread(self._freeze_lines, rollout_id, stored)

    def _drop(self, rollout_id: str, snapshot_id: str, version: int) -> bool:
        files = self._files(rollout_id)
        if not exists(files.state):
            return False
        with files.locked(exclusive=True):
            files.check_files()
            state = files.read_state()
            if not state.names(snapshot_id, version):
                return False
            if not state.retired:
                # The tombstone first: a crash before the deletes below leaves a
                # retired capture with orphan data files (removed by the next
                # drop or a sweep), never a live capture with half its files.
                state.retired = True
                files.write_state(state)
            files.remove_data_files()
            self._forget(rollout_id)
            return True

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        """Delete exactly that snapshot's data, keeping the state as a retired tombstone."""
        check_store_id(rollout_id)
        return await asyncio.to_thread(self._drop, rollout_id, snapshot_id, version)

    # -- lineage -------------------------------------------------------------

    def _committed_entries(self, rollout_id: str) -> tuple[TokenEntry, ...]:
        files = self._files(rollout_id)
        if not exists(files.state):
            return ()  # nothing acknowledged yet (and no lock file is created for a stranger)
        with files.locked(exclusive=False):
            files.check_files()
            state = files.read_state()
            if state.retired:
                return ()
            # Only the indexed part: a line past it was never acknowledged to its writer.
            return _read_entries(files, state, rollout_id)

    async def committed_entries(self, rollout_id: str) -> tuple[TokenEntry, ...]:
        """The rollout's acknowledged entries in put order, read under the shared lock.

        Read-only (lineage resolution of a rollout still being written): no
        freeze, no tail indexing. A retired or unknown rollout has none.
        """
        check_store_id(rollout_id)
        return await asyncio.to_thread(self._committed_entries, rollout_id)

    def _resolve_lineage(
        self, rollout_id: str, query: LineageQuery, *, inline: bool = False
    ) -> Resolution | None:
        """Resolve under the shared lock; with `inline`, None unless that is quick (the
        lock free, little to read): the caller then resolves in a worker thread."""
        files = self._files(rollout_id)
        if not exists(files.state):
            return resolve_query(EMPTY_LINEAGE, None, query)  # nothing acknowledged yet
        with files.locked(exclusive=False, blocking=not inline) as held:
            if not held:
                return None
            files.check_files()
            state = files.read_state()
            try:
                fd = None if state.retired else open_regular(files.jsonl, os.O_RDONLY)
            except FileNotFoundError:
                fd = None
            if fd is None:
                self._forget(rollout_id)
                return resolve_query(EMPTY_LINEAGE, None, query)
            try:
                # Only the acknowledged part (up to indexed_size): a line past it
                # was never confirmed to its writer.
                name = files.jsonl.name
                return self._indexes.resolve(rollout_id, fd, name, state, query, inline=inline)
            finally:
                os.close(fd)

    async def resolve_lineage(self, rollout_id: str, query: LineageQuery) -> Resolution:
        """Which acknowledged call of the rollout a request continues (read-only).

        Reads the state under the shared lock, then only the lines acknowledged
        since this store's index of the rollout last looked, and the answer's.
        Done on the event loop when the lock is free and little is to be read
        (the usual next call of a rollout: a worker-thread hop would cost more
        than the work), else in a worker thread.
        """
        check_store_id(rollout_id)
        check_resolution_request(
            query.fingerprint, query.fingerprint_version, query.context_digests
        )
        if not query.fingerprint:
            return resolve_query(EMPTY_LINEAGE, None, query)  # a root: nothing to read
        quick = self._resolve_lineage(rollout_id, query, inline=True)
        if quick is not None:
            return quick
        resolved = await asyncio.to_thread(self._resolve_lineage, rollout_id, query)
        assert resolved is not None  # a blocking resolve always answers
        return resolved

    # -- lifecycle -----------------------------------------------------------

    async def memory_health(self) -> MemoryHealth | None:
        """No memory limit to report (docs/capacity.md)."""
        return None

    async def cumulative_ids(self, rollout_id: str, model_call_id: str) -> Ids | None:
        """The cumulative ids of a call this process stored (None: not at hand; a delta
        put's parent, docs/store-protocol.md#delta-put)."""
        return self._known.ids_of(check_store_id(rollout_id), model_call_id)

    async def ping(self) -> None:
        """Reachable when the directory exists and is writable."""
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise StoreUnreachable(f"capture directory {self.directory} is not writable")

    async def close(self) -> None:
        """Nothing to release: every operation opens and closes its own files."""
