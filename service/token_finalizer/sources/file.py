"""The file capture store: one directory shared by writers and the finalizer.

On-disk layout per rollout id `R` (compatible with NeMo Gym's training-token
file store, so either side can read what the other wrote):

    R.tokens.jsonl        one TokenEntry per line, compact sorted-key JSON, fsynced per put
    R.tokens.state.json   CaptureState, replaced atomically (temp file + rename)
    R.tokens.lock         flock: exclusive for mutations, shared for plain reads
    R.tokens.intents      announced model call ids, one per line
    R.tokens.incomplete   model call ids that failed to capture, one per line

Every public method is async and runs its blocking file work in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson

from token_finalizer.core.codec import loads_json
from token_finalizer.core.entries import Snapshot, TokenEntry
from token_finalizer.core.errors import CaptureConflict, CaptureCorrupt
from token_finalizer.core.identity import check_store_id
from token_finalizer.sources._entries import entry_payload, parse_capture, same_payload
from token_finalizer.sources._state import CaptureState, PutDecision, line_digest

__all__ = ["FileTokenStore", "FrozenLines", "SweptCapture"]

_SUFFIX = ".tokens"
_Content = TypeVar("_Content")
_STATE_SUFFIX = ".tokens.state.json"
_JSONL_SUFFIX = ".tokens.jsonl"


@dataclass(frozen=True, slots=True)
class SweptCapture:
    """One capture that a sweep removed (or would remove, in a dry run)."""

    rollout_id: str
    reason: str  # "retired" or "abandoned"
    age_seconds: float


@dataclass(frozen=True, slots=True)
class FrozenLines:
    """A frozen snapshot as its stored entry lines, unparsed (what the store server sends on)."""

    rollout_id: str
    lines: tuple[bytes, ...]
    incomplete: bool
    snapshot_id: str
    version: int


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


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _append_durably(path: Path, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _read_indexed(paths: _Paths, state: CaptureState) -> bytes:
    """The indexed part of the jsonl file (nothing past the last acknowledged line)."""
    try:
        with open(paths.jsonl, "rb") as handle:
            return handle.read(state.indexed_size)
    except FileNotFoundError:
        return b""


def _lines(data: bytes) -> Iterator[bytes]:
    start = 0
    while start < len(data):
        end = data.find(b"\n", start)
        if end < 0:
            end = len(data)
        yield data[start:end]
        start = end + 1


def _read_lines(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text().splitlines() if line]
    except FileNotFoundError:
        return []


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
            handle = open(paths.lock, "a+b")  # noqa: SIM115 - closed below, after unlock
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
                try:
                    same = os.fstat(handle.fileno()).st_ino == os.stat(paths.lock).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    yield
                    return
            finally:
                handle.close()  # closing releases the flock

    def _read_state(self, paths: _Paths) -> CaptureState:
        try:
            raw = paths.state.read_bytes()
        except FileNotFoundError:
            return CaptureState()
        try:
            return CaptureState.from_dict(orjson.loads(raw))
        except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError) as exc:
            raise CaptureCorrupt(f"{paths.state.name} is not a valid state file: {exc}") from None

    def _write_state(self, paths: _Paths, state: CaptureState) -> None:
        temp = paths.state.with_name(f".{paths.state.name}.{uuid.uuid4().hex}.tmp")
        try:
            with open(temp, "wb") as handle:
                handle.write(orjson.dumps(state.to_dict()))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, paths.state)
        finally:
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
            size = paths.jsonl.stat().st_size
        except FileNotFoundError:
            size = 0
        if size == state.indexed_size:
            return False
        if size < state.indexed_size:
            raise CaptureCorrupt(
                f"{paths.jsonl.name} is shorter ({size} bytes) than its index "
                f"({state.indexed_size} bytes)"
            )
        with open(paths.jsonl, "r+b") as handle:
            handle.seek(state.indexed_size)
            *lines, torn = handle.read().split(b"\n")
            offset = state.indexed_size
            for line in lines:
                if line.strip():
                    self._index_line(paths, state, line, offset)
                offset += len(line) + 1
            if torn:
                handle.truncate(offset)
                handle.flush()
                os.fsync(handle.fileno())
        state.indexed_size = offset
        state.version += 1
        return True

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
        with open(paths.jsonl, "rb") as handle:
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
            _append_durably(paths.jsonl, line + b"\n")
            state.record_put(parsed.model_call_id, digest)
            state.indexed_size += len(line) + 1
            self._write_state(paths, state)

    def _mark_incomplete_locked(
        self, paths: _Paths, state: CaptureState, rollout_id: str, model_call_id: str
    ) -> None:
        state.mark_incomplete(rollout_id)
        if model_call_id:
            _append_durably(paths.incomplete, model_call_id.encode() + b"\n")
        self._write_state(paths, state)

    def _mark_incomplete(self, rollout_id: str, model_call_id: str) -> None:
        paths = _Paths(self.directory, rollout_id)
        if model_call_id:
            check_store_id(model_call_id, what="model_call_id")
        with self._locked(paths, exclusive=True):
            state = self._read_state(paths)
            self._index_tail(paths, state)
            self._mark_incomplete_locked(paths, state, rollout_id, model_call_id)

    def _begin_call(self, rollout_id: str, model_call_id: str) -> None:
        paths = _Paths(self.directory, rollout_id)
        check_store_id(model_call_id, what="model_call_id")
        with self._locked(paths, exclusive=True):
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
            state = self._read_state(paths)
            changed = self._index_tail(paths, state)
            try:
                changed = state.freeze(rollout_id) or changed
            finally:
                if changed:
                    self._write_state(paths, state)
            content = read(paths, state)
            missing = set(_read_lines(paths.intents)) - state.entry_digests.keys()
        return content, state, state.incomplete or bool(missing)

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
        if not paths.state.exists():
            return False
        with self._locked(paths, exclusive=True):
            state = self._read_state(paths)
            if not state.names(snapshot_id, version):
                return False
            if state.retired:
                return True
            for path in paths.data_files():
                path.unlink(missing_ok=True)
            state.retired = True
            self._write_state(paths, state)
            return True

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
        if not paths.state.exists():
            return ()  # nothing acknowledged yet (and no lock file is created for a stranger)
        with self._locked(paths, exclusive=False):
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
        if not paths.state.exists() and not paths.jsonl.exists():
            return None
        with self._locked(paths, exclusive=False):
            return self._read_state(paths).to_dict()

    def rollout_ids(self) -> list[str]:
        """Every rollout with a state file or a capture file in the directory."""
        names = {
            path.name.removesuffix(suffix)
            for suffix in (_STATE_SUFFIX, _JSONL_SUFFIX)
            for path in self.directory.glob(f"*{suffix}")
        }
        return sorted(names)

    def delete(self, rollout_id: str) -> None:
        """Remove every file of one rollout, tombstone included (admin use only)."""
        paths = _Paths(self.directory, rollout_id)
        with self._locked(paths, exclusive=True):
            for path in (*paths.data_files(), paths.state):
                path.unlink(missing_ok=True)
            paths.lock.unlink(missing_ok=True)

    def sweep(
        self,
        *,
        retired_older_than: float,
        abandoned_older_than: float | None = None,
        dry_run: bool = False,
        now: float | None = None,
    ) -> list[SweptCapture]:
        """Remove retired tombstones and, only when asked, never-frozen captures gone quiet.

        A frozen capture that was not retired is evidence and is never touched.
        """
        now = time.time() if now is None else now
        swept: list[SweptCapture] = []
        for rollout_id in self.rollout_ids():
            paths = _Paths(self.directory, rollout_id)
            with self._locked(paths, exclusive=True):
                state = self._read_state(paths)
                files = [p for p in (*paths.data_files(), paths.state) if p.exists()]
                if not files:
                    continue
                age = now - max(p.stat().st_mtime for p in files)
                if state.retired and age >= retired_older_than:
                    reason = "retired"
                elif (
                    abandoned_older_than is not None
                    and not state.frozen
                    and age >= abandoned_older_than
                ):
                    reason = "abandoned"
                else:
                    continue
                swept.append(SweptCapture(rollout_id, reason, age))
                if not dry_run:
                    for path in files:
                        path.unlink(missing_ok=True)
                    paths.lock.unlink(missing_ok=True)
        return swept

    async def ping(self) -> None:
        """Reachable when the directory exists and is writable."""
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise OSError(f"capture directory {self.directory} is not writable")

    async def close(self) -> None:
        """Nothing to release: every operation opens and closes its own files."""
