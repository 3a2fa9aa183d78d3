"""An in-process capture store, for tests and for embedding in one process.

The file store's semantics over dicts, both sides and the admin, and external
staging beside them (`memory_staging`). A plain lock guards it: every method
is short and never awaits while holding it. Each rollout's lineage index is
fed by its puts (docs/store-protocol.md#lineage-index).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from token_finalizer._constants import LINEAGE_CACHE_MAX_TOKENS, STORE_ENCODE_IN_THREAD_MIN_TOKENS
from token_finalizer.core.entries import Snapshot, TokenEntry
from token_finalizer.core.errors import CaptureConflict
from token_finalizer.core.identity import check_model_call_id, check_new_store_id, check_store_id
from token_finalizer.core.lineage_chains import ChainCache, ScopedChains, remember_committed
from token_finalizer.core.lineage_index import EMPTY_LINEAGE, RolloutLineage
from token_finalizer.core.lineage_resolution import Resolution
from token_finalizer.core.token_ids import Ids
from token_finalizer.sources._entries import entry_parts, same_payload
from token_finalizer.sources._lineage import resolve_query
from token_finalizer.sources._packed import RolloutIds, expand_lines, stored_value
from token_finalizer.sources._staging import entries_refused
from token_finalizer.sources._staging_delegate import StagingDelegate
from token_finalizer.sources._state import CaptureState, PutDecision, line_digest
from token_finalizer.sources._stored import stored_entries
from token_finalizer.sources.base import (
    CaptureReport,
    FrozenLines,
    LineageQuery,
    MemoryHealth,
    SweepReport,
    SweepRules,
    SweptCapture,
)
from token_finalizer.sources.memory_staging import MemoryStaging, RolloutStaging

__all__ = ["MemoryStoreAdmin", "MemoryTokenStore"]

_WHERE = "the memory store"


@dataclass(slots=True)
class _Rollout:
    state: CaptureState = field(default_factory=CaptureState)
    # call id -> the stored value: its packed record or its line (sources/_packed.py)
    lines: dict[str, bytes] = field(default_factory=dict)
    ids: RolloutIds = field(default_factory=RolloutIds)
    intents: set[str] = field(default_factory=set)
    failed_calls: list[str] = field(default_factory=list)
    updated_at: float = field(default_factory=time.time)
    staging: RolloutStaging = field(default_factory=RolloutStaging)
    lineage: RolloutLineage = field(init=False)

    def __post_init__(self) -> None:
        self.lineage = RolloutLineage(self.load)

    def load(self, call_id: str) -> TokenEntry | None:
        """One stored call, read back from its stored value (the lineage index's loader)."""
        stored = self.lines.get(call_id)
        return None if stored is None else TokenEntry.from_json(self.ids.render(stored))

    def entry_lines(self) -> tuple[bytes, ...]:
        """The canonical lines of the stored entries, in put order."""
        return expand_lines(self.lines.values())

    def missing_calls(self) -> set[str]:
        return self.intents - self.lines.keys()

    def holds_entries(self) -> bool:
        """Whether token capture wrote anything (then staging is refused)."""
        return bool(self.state.incomplete or self.lines or self.intents or self.failed_calls)

    def holds_nothing(self) -> bool:
        return not (self.holds_entries() or self.staging.holds_any())

    def check_entries_writable(self, rollout_id: str) -> None:
        """A token-capture write: refused once frozen or retired, and for a staging rollout."""
        self.state.check_writable(rollout_id)
        if self.staging.holds_any():
            raise entries_refused(rollout_id)


class MemoryTokenStore(StagingDelegate):
    """CaptureStore over dicts, with the file store's semantics."""

    kind = "memory"
    _staging: MemoryStaging

    def __init__(self) -> None:
        self._rollouts: dict[str, _Rollout] = {}
        self._lock = threading.Lock()
        self._chains = ChainCache(LINEAGE_CACHE_MAX_TOKENS)
        self._admin = MemoryStoreAdmin(self)
        self._staging = MemoryStaging(self)

    @property
    def admin(self) -> MemoryStoreAdmin:
        """Inspect, delete and sweep this store."""
        return self._admin

    def _rollout(self, rollout_id: str) -> _Rollout:
        rollout = self._rollouts.setdefault(check_store_id(rollout_id), _Rollout())
        rollout.updated_at = time.time()
        return rollout

    async def put(self, entry: TokenEntry | Mapping[str, Any]) -> None:
        """Store one call; the same payload again is a no-op, a different one CaptureConflict."""
        parsed, line, payload = entry_parts(entry)
        digest = line_digest(line)
        with self._lock:
            rollout = self._rollout(parsed.rollout_id)
            rollout.check_entries_writable(parsed.rollout_id)
            decision = rollout.state.decide_put(parsed.model_call_id, digest)
            stored = rollout.lines.get(parsed.model_call_id)
            if (
                decision is PutDecision.CONFLICT
                and stored is not None
                and same_payload(rollout.ids.render(stored), line)
            ):
                return  # the same payload, serialized by another encoder
            if decision is PutDecision.SAME:
                return
            if decision is PutDecision.CONFLICT:
                rollout.state.mark_incomplete(parsed.rollout_id)
                rollout.failed_calls.append(parsed.model_call_id)
                raise CaptureConflict(
                    f"model call {parsed.model_call_id} of rollout {parsed.rollout_id} "
                    "was already stored with a different payload"
                )
            rollout.lines[parsed.model_call_id] = stored_value(
                payload, line, digest, parsed, rollout.ids
            )[0]
            rollout.state.record_put(parsed.model_call_id, digest)
            link = rollout.lineage.add(parsed)
            if link is not None:
                remember_committed(parsed, link, self._chains_of(rollout))

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        """Record that a call of this rollout failed to capture (allowed after freeze)."""
        check_new_store_id(rollout_id)
        if model_call_id:
            check_model_call_id(model_call_id)
        with self._lock:
            rollout = self._rollout(rollout_id)
            if rollout.staging.holds_any():
                raise entries_refused(rollout_id)
            rollout.state.mark_incomplete(rollout_id)
            if model_call_id:
                rollout.failed_calls.append(model_call_id)

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        """Announce a call; a snapshot missing its entry is incomplete."""
        check_new_store_id(rollout_id)
        check_model_call_id(model_call_id)
        with self._lock:
            rollout = self._rollout(rollout_id)
            rollout.check_entries_writable(rollout_id)
            rollout.intents.add(model_call_id)

    async def freeze(self, rollout_id: str) -> Snapshot:
        """Freeze (idempotent) and return the rollout's immutable snapshot."""
        with self._lock:
            rollout = self._rollout(rollout_id)
            rollout.state.freeze(rollout_id)
            staged = rollout.staging
            return Snapshot(
                rollout_id=rollout_id,
                entries=stored_entries(rollout.lines.values(), rollout_id, _WHERE),
                incomplete=rollout.state.incomplete or bool(rollout.missing_calls()),
                snapshot_id=str(rollout.state.snapshot_id),
                version=rollout.state.version,
                staged=staged.frozen_capture(rollout_id) if staged.holds_any() else None,
            )

    async def freeze_lines(self, rollout_id: str, *, stored: bool = False) -> FrozenLines:
        """`freeze`, answering the entry lines as written by `put` (`stored`: the values
        as stored, packed records among them)."""
        with self._lock:
            rollout = self._rollout(rollout_id)
            rollout.state.freeze(rollout_id)
            staged = rollout.staging
            return FrozenLines(
                rollout_id=rollout_id,
                lines=tuple(rollout.lines.values()) if stored else rollout.entry_lines(),
                incomplete=rollout.state.incomplete or bool(rollout.missing_calls()),
                snapshot_id=str(rollout.state.snapshot_id),
                version=rollout.state.version,
                staged=staged.frozen_lines(rollout_id) if staged.holds_any() else None,
            )

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        """Retire exactly that snapshot, keeping the state as a tombstone."""
        check_store_id(rollout_id)
        with self._lock:
            rollout = self._rollouts.get(rollout_id)
            if rollout is None or not rollout.state.names(snapshot_id, version):
                return False
            if not rollout.state.retired:
                rollout.state.retired = True
                rollout.updated_at = time.time()
                rollout.lines.clear()
                rollout.ids = RolloutIds()
                rollout.intents.clear()
                rollout.failed_calls.clear()
                rollout.staging.clear()
                self._forget(rollout)
                rollout.lineage = RolloutLineage(rollout.load)
            return True

    async def committed_entries(self, rollout_id: str) -> tuple[TokenEntry, ...]:
        """The rollout's stored entries in put order, read without freezing (lineage resolution).

        A retired or unknown rollout has none; nothing is created or changed.
        """
        check_store_id(rollout_id)
        with self._lock:
            rollout = self._rollouts.get(rollout_id)
            if rollout is None or rollout.state.retired:
                return ()
            return stored_entries(rollout.lines.values(), rollout_id, _WHERE)

    def _chains_of(self, rollout: _Rollout) -> ScopedChains:
        return ScopedChains(self._chains, rollout.lineage.scope)

    def _forget(self, rollout: _Rollout) -> None:
        """Drop the cached chains of a rollout whose entries are gone."""
        self._chains.forget(rollout.lineage.scope)

    def _resolve_lineage(self, rollout_id: str, query: LineageQuery) -> Resolution:
        with self._lock:
            rollout = self._rollouts.get(rollout_id)
            if rollout is None or rollout.state.retired:
                return resolve_query(EMPTY_LINEAGE, None, query)
            return resolve_query(rollout.lineage, self._chains_of(rollout), query)

    async def resolve_lineage(self, rollout_id: str, query: LineageQuery) -> Resolution:
        """Which stored call of the rollout a request continues (read-only), from its index."""
        check_store_id(rollout_id)
        rollout = self._rollouts.get(rollout_id)
        if rollout is not None and rollout.lineage.tokens >= STORE_ENCODE_IN_THREAD_MIN_TOKENS:
            return await asyncio.to_thread(self._resolve_lineage, rollout_id, query)
        return self._resolve_lineage(rollout_id, query)

    async def memory_health(self) -> MemoryHealth | None:
        """No memory limit to report (docs/capacity.md)."""
        return None

    async def cumulative_ids(self, rollout_id: str, model_call_id: str) -> Ids | None:
        """A stored call's cumulative ids (prompt + generation), or None (a delta put's
        parent, docs/store-protocol.md#delta-put)."""
        with self._lock:
            rollout = self._rollouts.get(check_store_id(rollout_id))
            if rollout is None or rollout.state.retired:
                return None
            return rollout.ids.get(model_call_id)

    async def ping(self) -> None:
        """Always reachable."""

    async def close(self) -> None:
        """Nothing to release."""


class MemoryStoreAdmin:
    """StoreAdmin over a MemoryTokenStore."""

    def __init__(self, store: MemoryTokenStore) -> None:
        self._store = store

    async def status(self, rollout_id: str) -> CaptureState | None:
        """The stored state of one rollout, or None when nothing is stored."""
        with self._store._lock:
            rollout = self._store._rollouts.get(check_store_id(rollout_id))
            return None if rollout is None else CaptureState.from_dict(rollout.state.to_dict())

    async def inspect(self, rollout_id: str) -> CaptureReport | None:
        """One capture's report, or None when nothing is stored."""
        with self._store._lock:
            rollout = self._store._rollouts.get(check_store_id(rollout_id))
            if rollout is None:
                return None
            state = rollout.state
            return CaptureReport.of_state(
                rollout_id,
                "memory",
                state,
                entries=len(state.entry_digests),
                incomplete_call_ids=tuple(sorted(set(rollout.failed_calls))),
                missing_call_ids=tuple(sorted(rollout.missing_calls())),
                announced_calls=len(rollout.intents),
                staging=rollout.staging.report() if rollout.staging.holds_any() else None,
            )

    async def delete(self, rollout_id: str) -> tuple[str, ...]:
        """Forget one rollout entirely; its id when something was stored."""
        with self._store._lock:
            removed = self._store._rollouts.pop(check_store_id(rollout_id), None)
        if removed is None:
            return ()
        self._store._forget(removed)
        return (rollout_id,)

    async def sweep(
        self, rules: SweepRules, *, dry_run: bool = False, now: float | None = None
    ) -> SweepReport:
        """Forget what `rules` select, by the age of each rollout's last change."""
        clock = time.time() if now is None else now
        swept = []
        with self._store._lock:
            for rollout_id, rollout in sorted(self._store._rollouts.items()):
                age = clock - rollout.updated_at
                reason = rules.reason(rollout.state, age, holds_nothing=rollout.holds_nothing())
                if reason is not None:
                    swept.append(SweptCapture(rollout_id, reason, age))
            if not dry_run:
                for capture in swept:
                    self._store._forget(self._store._rollouts.pop(capture.rollout_id))
        return SweepReport(captures=tuple(swept))

    async def rollout_ids(self) -> list[str]:
        """Every rollout the store holds, sorted."""
        with self._store._lock:
            return sorted(self._store._rollouts)
