"""External staging in the memory store: ledger rows and staged calls beside the entries.

Each rollout of a `MemoryTokenStore` carries a `RolloutStaging` (its ledger
index and its staged calls); `MemoryStaging` implements the StagingStore
methods over them under the store's lock, with the file store's rules
(docs/staging.md#storage): write-once, custody checks at stage time, the
fence after freeze and the family guard. Every write bumps the rollout's
version, as a put does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from token_finalizer.core.errors import CaptureConflict
from token_finalizer.core.identity import check_model_call_id, check_store_id
from token_finalizer.core.staging import (
    LedgerConflict,
    LedgerResolution,
    LedgerWrite,
    RolloutManifest,
    StagedCallBaseSnapshot,
    StagedCallRecord,
    StagedCapture,
    check_custody,
    stored_snapshot,
)
from token_finalizer.sources._staged_packed import base_from_stored, expand_base, pack_base
from token_finalizer.sources._staging import (
    base_json_of,
    checked_attachments,
    checked_failure_row,
    checked_ledger_row,
    clear_refused,
    cleared_call_ids,
    cleared_conflict,
    extras_json,
    staged_ancestors,
    staged_lines,
    staging_refused,
    staging_report,
)
from token_finalizer.sources._staging_index import LedgerIndex, StagedCallCache
from token_finalizer.sources.base import (
    Attachment,
    LineageQuery,
    StagedExtras,
    StagedLines,
    StagingReport,
)

if TYPE_CHECKING:
    from token_finalizer.sources._state import CaptureState

__all__ = ["MemoryStaging", "RolloutStaging", "StagedCall"]


@dataclass(frozen=True, slots=True)
class StagedCall:
    """One staged call as the memory store keeps it: its base snapshot packed
    (`_staged_packed.pack_base`, docs/staging.md#packed-at-rest), the rest as staged."""

    stored: bytes
    digest: str
    rest: bytes
    extras: dict[str, Any] | None
    attachments: dict[str, dict[str, Any]] | None

    @property
    def base(self) -> bytes:
        """The base snapshot JSON, byte for byte as staged."""
        return expand_base(self.stored)

    def snapshot(self) -> StagedCallBaseSnapshot:
        """The base snapshot, read back from its stored form."""
        return stored_snapshot(base_from_stored(self.stored))


@dataclass(slots=True)
class RolloutStaging:
    """A rollout's ledger and staged calls (empty for a token-capture rollout)."""

    ledger: LedgerIndex = field(default_factory=LedgerIndex)
    calls: dict[str, StagedCall] = field(default_factory=dict)
    # Staged calls deleted by a clear: never staged again (write-once).
    cleared: set[str] = field(default_factory=set)

    def holds_any(self) -> bool:
        """Whether the rollout holds any ledger row, staged call or cleared call."""
        return bool(self.ledger.rows or self.calls or self.cleared)

    def clear(self) -> None:
        """Forget every row and call (a drop keeps only the state)."""
        self.ledger = LedgerIndex()
        self.calls.clear()
        self.cleared.clear()

    def frozen_lines(self, rollout_id: str) -> StagedLines:
        """The manifest and, per record, its staged base JSON."""

        def base_of(call_id: str) -> bytes | None:
            call = self.calls.get(call_id)
            return None if call is None else call.base

        return staged_lines(self.ledger.manifest(rollout_id), base_of)

    def frozen_capture(self, rollout_id: str) -> StagedCapture:
        """The manifest and, per record, its staged base snapshot."""
        manifest = self.ledger.manifest(rollout_id)
        snapshots = tuple(
            None if call is None else call.snapshot()
            for call in (self.calls.get(record.model_call_id) for record in manifest.records)
        )
        return StagedCapture(manifest=manifest, snapshots=snapshots)

    def report(self) -> StagingReport:
        """What `store inspect` shows."""
        return staging_report(self.ledger.rows, self.calls, len(self.cleared))


class StagingRollout(Protocol):
    """What staging needs of one rollout of the memory store (`memory._Rollout`)."""

    @property
    def state(self) -> CaptureState: ...

    @property
    def staging(self) -> RolloutStaging: ...

    def holds_entries(self) -> bool: ...


class StagingHost(Protocol):
    """What staging needs of the memory store: its lock and its rollouts.

    A protocol, so that this module does not import `memory` (which imports it).
    """

    @property
    def _lock(self) -> threading.Lock: ...

    @property
    def _rollouts(self) -> Mapping[str, StagingRollout]: ...

    def _rollout(self, rollout_id: str) -> StagingRollout: ...


class MemoryStaging:
    """The StagingStore methods of a MemoryTokenStore, over its rollouts and lock."""

    def __init__(self, store: StagingHost) -> None:
        self._store = store
        # Staged calls are kept packed; the custody walk reads its ancestors from here.
        self._parsed = StagedCallCache()

    @property
    def _lock(self) -> threading.Lock:
        return self._store._lock

    def _writable(self, rollout_id: str) -> StagingRollout:
        """The rollout to write staging to (created when new), under the lock."""
        rollout = self._store._rollout(rollout_id)
        rollout.state.check_writable(rollout_id)
        if rollout.holds_entries():
            raise staging_refused(rollout_id)
        return rollout

    def _reading(self, rollout_id: str, read: Callable[[RolloutStaging], Any], empty: Any) -> Any:
        with self._lock:
            rollout = self._store._rollouts.get(check_store_id(rollout_id))
            return empty if rollout is None else read(rollout.staging)

    # -- the ledger --------------------------------------------------------------------

    async def record_ledger_row(self, rollout_id: str, row: Mapping[str, Any]) -> bool:
        """Append a committed row (write-once); False for an identical replay."""
        checked = checked_ledger_row(row)
        with self._lock:
            rollout = self._writable(rollout_id)
            try:
                decision = rollout.staging.ledger.plan_commit(checked)
            except LedgerConflict as conflict:
                raise CaptureConflict(f"rollout {rollout_id}: {conflict}") from None
            return self._append(rollout, checked, decision)

    async def record_ledger_failure(self, rollout_id: str, model_call_id: str, reason: str) -> bool:
        """Append a failure row; False when that (call, reason) row is stored."""
        row = checked_failure_row(model_call_id, reason)
        with self._lock:
            rollout = self._writable(rollout_id)
            return self._append(rollout, row, rollout.staging.ledger.plan_failure(row))

    @staticmethod
    def _append(rollout: StagingRollout, row: dict[str, Any], decision: LedgerWrite) -> bool:
        if decision is LedgerWrite.REPLAY:
            return False
        rollout.staging.ledger.add(row)
        rollout.state.version += 1
        return True

    async def ledger_has_rows(self, rollout_id: str) -> bool:
        """Whether the rollout's ledger holds any row."""
        return bool(self._reading(rollout_id, lambda staging: len(staging.ledger), 0))

    async def ledger_manifest(self, rollout_id: str) -> RolloutManifest:
        """The manifest of the rollout's ledger."""
        empty = RolloutManifest(rollout_id=check_store_id(rollout_id))
        manifest: RolloutManifest = self._reading(
            rollout_id, lambda staging: staging.ledger.manifest(rollout_id), empty
        )
        return manifest

    async def resolve_ledger(self, rollout_id: str, query: LineageQuery) -> LedgerResolution | None:
        """Resolution over the ledger's rows of the fingerprint; None without ledger rows."""

        def resolve(staging: RolloutStaging) -> LedgerResolution | None:
            return staging.ledger.resolve(query) if staging.ledger.rows else None

        resolution: LedgerResolution | None = self._reading(rollout_id, resolve, None)
        return resolution

    # -- staged calls ------------------------------------------------------------------

    async def stage(
        self, record: StagedCallRecord, attachments: Mapping[str, Attachment] | None = None
    ) -> bool:
        """Store a staged call after the custody checks; False for an identical replay."""
        checked = checked_attachments(attachments)
        rollout_id, call_id = check_store_id(record.rollout_id), record.model_call_id
        check_model_call_id(call_id)
        data = StagedCallBaseSnapshot.to_json(record, native_columns=True)
        packed, rest = pack_base(data, base_json_of(data)), extras_json(record, checked)
        with self._lock:
            rollout = self._writable(rollout_id)
            calls = rollout.staging.calls
            stored = calls.get(call_id)
            if stored is not None and (stored.stored, stored.rest) == (packed, rest):
                return False
            ancestors: list[StagedCallBaseSnapshot] = []
            if record.parent_call_id is not None:

                def lookup(ancestor: str) -> StagedCallBaseSnapshot | None:
                    found = calls.get(ancestor)
                    if found is None:
                        return None
                    snapshot = self._parsed.get(found.digest)
                    if snapshot is None:
                        snapshot = found.snapshot()
                        self._parsed.put(snapshot)
                    return snapshot

                ancestors = staged_ancestors(record.parent_call_id, lookup, len(calls))
            check_custody(record, ancestors)
            if call_id in rollout.staging.cleared:
                raise cleared_conflict(rollout_id, call_id)
            if stored is not None:
                raise CaptureConflict(
                    f"call {call_id} of rollout {rollout_id} was already staged "
                    "with a different payload"
                )
            calls[call_id] = StagedCall(packed, record.digest, rest, record.extras, checked)
            self._parsed.put(record.base_snapshot())
            rollout.state.version += 1
            return True

    async def clear_staged(self, rollout_id: str, call_ids: Sequence[str]) -> int:
        """Delete exactly these staged calls; how many were held (idempotent)."""
        ids = cleared_call_ids(call_ids)
        if not ids:
            return 0
        with self._lock:
            rollout = self._store._rollouts.get(check_store_id(rollout_id))
            if rollout is None or rollout.state.retired:
                return 0
            if rollout.state.frozen:
                raise clear_refused(rollout_id)
            staging = rollout.staging
            held = [call_id for call_id in ids if call_id in staging.calls]
            for call_id in held:
                del staging.calls[call_id]
            staging.cleared.update(held)
            return len(held)

    def _calls(self, rollout_id: str) -> dict[str, StagedCall]:
        calls: dict[str, StagedCall] = self._reading(
            rollout_id, lambda staging: dict(staging.calls), {}
        )
        return calls

    async def fetch_staged(
        self, rollout_id: str, call_ids: Sequence[str]
    ) -> tuple[bytes | None, ...]:
        """Each call's base snapshot JSON, in order; None when not staged."""
        calls = self._calls(rollout_id)
        return tuple(None if (call := calls.get(i)) is None else call.base for i in call_ids)

    async def fetch_extras(self, rollout_id: str, call_ids: Sequence[str]) -> StagedExtras:
        """The extras of the staged calls among `call_ids`."""
        calls = self._calls(rollout_id)
        return {i: calls[i].extras for i in call_ids if i in calls}

    async def fetch_attachments(
        self, rollout_id: str, model_call_id: str
    ) -> dict[str, Attachment] | None:
        """The call's attachments ({} when it staged none); None when not staged."""
        call = self._calls(rollout_id).get(model_call_id)
        if call is None:
            return None
        return dict(call.attachments or {})
