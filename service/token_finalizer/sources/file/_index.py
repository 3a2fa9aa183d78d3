"""The file store's lineage indexes: one per recently resolved rollout, kept in the store object.

Writers in other processes append to a rollout's jsonl, so an index cannot be
fed by this process's puts alone. Each index remembers how far into the jsonl
it has read; a resolve (under the rollout's shared lock) reads the state file
to learn `indexed_size`, the acknowledged end, and parses only the lines in
between: never the whole file again. An index is keyed by the jsonl's device
and inode and checked against the state's digest of its last line, so a
capture that was swept, deleted or recreated is noticed and indexed afresh.
Only the first copy of each call is located (byte offset and length); the
answer's lines are read back from there. The least recently resolved
rollouts are dropped beyond a bound. See docs/store-protocol.md#lineage-index.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator

from token_finalizer._constants import PARSE_IN_THREAD_MIN_BYTES, STORE_ENCODE_IN_THREAD_MIN_TOKENS
from token_finalizer.core.entries import TokenEntry
from token_finalizer.core.errors import CaptureCorrupt, TokenEntryError
from token_finalizer.core.indexed_resolution import answer, choose
from token_finalizer.core.lineage_chains import ChainCache, ScopedChains, remember_committed
from token_finalizer.core.lineage_index import CallLink, RolloutLineage
from token_finalizer.core.lineage_resolution import Resolution
from token_finalizer.sources._packed import RolloutIds, from_file_line, is_packed
from token_finalizer.sources._state import CaptureState, line_digest
from token_finalizer.sources.base import LineageQuery

__all__ = ["FileLineageIndexes"]


def _long(link: CallLink, chains: ScopedChains) -> bool:
    """Whether rebuilding and checking the call's cumulative ids belongs in a worker thread:
    a long answer, or a delta chain that may have to be read from far back."""
    expected = link.cum_len if link.cum_len is not None else link.own_length
    if expected >= STORE_ENCODE_IN_THREAD_MIN_TOKENS:
        return True
    if chains.cached(link.call_id) is not None:
        return False
    return link.prompt_is_delta and (
        not link.parent_call_id or chains.cached(link.parent_call_id) is None
    )


_Identity = tuple[int, int]  # (st_dev, st_ino) of the jsonl


class _IndexedCapture:
    """One rollout's index and how far into its jsonl (`offset`) it has read."""

    __slots__ = (
        "_fd",
        "identity",
        "ids",
        "last",
        "lineage",
        "locations",
        "lock",
        "name",
        "offset",
    )

    def __init__(self, identity: _Identity, name: str) -> None:
        self.identity = identity
        self.name = name  # the jsonl's file name, for error messages
        self.offset = 0
        self.locations: dict[str, tuple[int, int]] = {}  # call id -> (offset, length)
        self.last: tuple[str, str] | None = None  # (call id, line digest) of the last line read
        self.lock = threading.Lock()
        self.lineage = RolloutLineage(self._load)
        self.ids = RolloutIds()  # to expand packed lines (sources/_packed.py)
        self._fd: int | None = None

    def _load(self, call_id: str) -> TokenEntry | None:
        """The first stored copy of a call, read back from the open jsonl."""
        where = self.locations.get(call_id)
        if where is None or self._fd is None:
            return None
        offset, length = where
        line = os.pread(self._fd, length, offset)
        if len(line) != length:
            raise CaptureCorrupt(f"{self.name} is shorter than its index ({offset + len(line)})")
        return TokenEntry.from_json(self.ids.render(from_file_line(line)))

    def consistent(self, state: CaptureState) -> bool:
        """Whether the stored state still describes the file this index read."""
        if state.indexed_size < self.offset:
            return False
        return self.last is None or state.entry_digests.get(self.last[0]) == self.last[1]

    def reset(self, chains: ChainCache) -> None:
        """Start over (the file was replaced under the same inode); drop its cached chains."""
        chains.forget(self.lineage.scope)
        self.offset = 0
        self.locations = {}
        self.last = None
        self.lineage = RolloutLineage(self._load)
        self.ids = RolloutIds()

    def add(self, line: bytes, offset: int, entry: TokenEntry, digest: str) -> CallLink | None:
        """Index one line of the jsonl, read at `offset` (`digest`: its canonical line's);
        the call's link when it is new."""
        self.locations.setdefault(entry.model_call_id, (offset, len(line)))
        self.last = (entry.model_call_id, digest)
        self.offset = offset + len(line) + 1
        return self.lineage.add(entry)

    def catch_up(self, state: CaptureState, rollout_id: str) -> None:
        """Read the lines acknowledged since the last look, `[offset, indexed_size)`."""
        assert self._fd is not None  # inside `open_for`
        wanted = state.indexed_size - self.offset
        if wanted <= 0:
            return
        data = os.pread(self._fd, wanted, self.offset)
        if len(data) != wanted:
            raise CaptureCorrupt(
                f"{self.name} is shorter ({self.offset + len(data)} bytes) than its index "
                f"({state.indexed_size} bytes)"
            )
        start = self.offset
        for line in data.split(b"\n"):
            if line.strip():
                value = from_file_line(line)
                packed = is_packed(value)
                canonical = self.ids.expand(value) if packed else value
                entry = TokenEntry.from_json(canonical)
                if entry.rollout_id != rollout_id:
                    raise TokenEntryError(
                        f"{self.name} holds an entry of rollout {entry.rollout_id}"
                    )
                if not packed:
                    self.ids.learn_entry(entry)
                self.add(line, start, entry, line_digest(canonical))
            start += len(line) + 1
        self.offset = state.indexed_size

    @contextlib.contextmanager
    def open_for(self, fd: int) -> Iterator[None]:
        """Lines are read back from `fd` (the open jsonl) while inside."""
        self._fd = fd
        try:
            yield
        finally:
            self._fd = None


class FileLineageIndexes:
    """The indexes of one file store, least recently used dropped beyond `max_rollouts`."""

    def __init__(self, max_rollouts: int, chains: ChainCache) -> None:
        self.max_rollouts = max_rollouts
        self.chains = chains
        self._captures: OrderedDict[str, _IndexedCapture] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._captures)

    def _capture(self, rollout_id: str, identity: _Identity, name: str) -> _IndexedCapture:
        with self._lock:
            capture = self._captures.get(rollout_id)
            if capture is not None and capture.identity == identity:
                self._captures.move_to_end(rollout_id)
                return capture
            if capture is not None:
                self.chains.forget(capture.lineage.scope)
            capture = self._captures[rollout_id] = _IndexedCapture(identity, name)
            self._captures.move_to_end(rollout_id)
            while len(self._captures) > self.max_rollouts:
                _, evicted = self._captures.popitem(last=False)
                self.chains.forget(evicted.lineage.scope)
            return capture

    def forget(self, rollout_id: str) -> None:
        """Drop a rollout's index and its cached chains (retired, deleted or swept)."""
        with self._lock:
            capture = self._captures.pop(rollout_id, None)
        if capture is not None:
            self.chains.forget(capture.lineage.scope)

    def resolve(
        self,
        rollout_id: str,
        fd: int,
        name: str,
        state: CaptureState,
        query: LineageQuery,
        *,
        inline: bool = False,
    ) -> Resolution | None:
        """Resolve a checked, non-root request over the rollout's acknowledged lines.

        The caller holds the shared lock and has `fd` open on the jsonl. With
        `inline` (on an event loop) nothing that may take long is done: None
        when another thread is resolving this rollout, when many bytes are to
        be read, or when the answer is long and not cached; the caller then
        resolves in a worker thread.
        """
        info = os.fstat(fd)
        capture = self._capture(rollout_id, (info.st_dev, info.st_ino), name)
        if not capture.lock.acquire(blocking=not inline):
            return None
        try:
            with capture.open_for(fd):
                if not capture.consistent(state):
                    capture.reset(self.chains)
                if inline and state.indexed_size - capture.offset >= PARSE_IN_THREAD_MIN_BYTES:
                    return None
                capture.catch_up(state, rollout_id)
                chains = ScopedChains(self.chains, capture.lineage.scope)
                digests = query.context_digests
                chosen = choose(capture.lineage, chains, query.fingerprint, digests)
                if isinstance(chosen, Resolution):
                    return chosen
                if inline and _long(chosen, chains):
                    return None
                return answer(chosen, capture.lineage, chains)
        finally:
            capture.lock.release()

    def committed(
        self,
        rollout_id: str,
        identity: _Identity,
        line: bytes,
        value: bytes,
        offset: int,
        entry: TokenEntry,
        digest: str,
    ) -> None:
        """A put of this process appended `line` (the stored `value`, whose canonical line
        has `digest`) at `offset`: index it without reading it.

        Only an index that has read everything before `offset` takes it (one
        that lags catches up at its next resolve). Under the exclusive lock.
        """
        with self._lock:
            capture = self._captures.get(rollout_id)
        if capture is None or capture.identity != identity:
            return
        with capture.lock:
            if capture.offset != offset:
                return
            capture.ids.learn(value, entry)
            link = capture.add(line, offset, entry, digest)
            if link is not None:
                remember_committed(entry, link, ScopedChains(self.chains, capture.lineage.scope))
