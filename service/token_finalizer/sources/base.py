"""The capture-store interface: what the finalizer, the store server and the store CLI call.

    CaptureSource   the finalizer's side of any store: freeze, drop, ping, close
    CaptureSink     the writer's side: put, mark_incomplete, begin_call, close
    StagingStore    NeMo Gym 0.7's external staging in a store: the capture ledger
                    (rows, failures, manifest, resolution) and the staged calls
    CaptureStore    a local store (memory, file, redis): both sides, staging, plus what
                    the store server serves (`freeze_lines`, `resolve_lineage`) and `admin`
    StoreAdmin      an operator's view of a local store: status, inspect, delete,
                    sweep, rollout ids; async, with the same shapes on every backend

The `http` source is a CaptureSource only (it speaks to a store server, which
holds a CaptureStore). Nothing here is optional: a backend implements a whole
protocol, so no caller looks for a method with `getattr`. The value types the
protocols exchange live here too. See docs/store-protocol.md#the-store-interface
and docs/staging.md#storage.

A rollout holds token entries or staging (ledger rows and staged calls),
never both: a write of the other family is refused with CaptureConflict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias, runtime_checkable

from token_finalizer.core.entries import Snapshot, TokenEntry
from token_finalizer.core.lineage_resolution import Resolution
from token_finalizer.core.staging import (
    PACKED_COLUMNS,
    LedgerResolution,
    RolloutManifest,
    StagedCallRecord,
    pack_columns,
    unpack_columns,
)
from token_finalizer.sources._state import CaptureState

__all__ = [
    "Attachment",
    "CaptureReport",
    "CaptureSink",
    "CaptureSource",
    "CaptureStore",
    "FrozenLines",
    "LineageQuery",
    "MemoryHealth",
    "ParsedStagedCall",
    "Skipped",
    "StagedExtras",
    "StagedLines",
    "StagedSnapshotLine",
    "StagingReport",
    "StagingStore",
    "StoreAdmin",
    "SweepReport",
    "SweepRules",
    "SweptCapture",
    "SweptLeftover",
]

#: One staged attachment as it travels and is kept: `{"bytes": "<standard base64>"}`
#: or `{"json": <any JSON value>}` (docs/staging.md#storage).
Attachment: TypeAlias = Mapping[str, Any]
#: The extras of staged calls by model call id (`None`: the call staged no extras);
#: a call the store does not hold is absent.
StagedExtras: TypeAlias = dict[str, dict[str, Any] | None]


# -- values ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ParsedStagedCall:
    """A staged call as a store parsed it from its line (docs/staging.md#storage).

    `record`: the stored record without its extras, and without its token
    columns when those were stored packed; `columns`: those packed columns
    as a 0.4.0 line holds them (base64 images, as a stage request sends
    them), else None; `arrays`: the columns a newer line held packed at rest
    (`sources/_staged_packed.py`), decoded: ids `uint64`, mask and log probs
    `float64`, native-endian, in `PACKED_COLUMNS` order; `extras`: the call's
    extras as stored.
    """

    record: dict[str, Any]
    extras: dict[str, Any] | None
    columns: dict[str, str] | None = None
    arrays: tuple[Any, Any, Any] | None = None

    def base(self) -> dict[str, Any]:
        """The base snapshot's JSON form, packed columns as native-endian arrays."""
        if self.arrays is not None:
            # The columns after the record's keys, as `unpack_columns` puts them.
            return {**self.record, **dict(zip(PACKED_COLUMNS, self.arrays, strict=True))}
        if self.columns is None:
            return self.record
        return unpack_columns(self.record, self.columns, native=True)

    def packed(self) -> dict[str, Any]:
        """`{"record", "columns", "extras"}`, the packed freeze form; ValueError if it cannot be."""
        if self.arrays is not None:
            packed = pack_columns(self.base())
            # The columns in a stored line's (sorted) order, as 0.4.0 lines held and sent them.
            columns = dict(sorted(packed["columns"].items()))
            return {"record": packed["record"], "columns": columns, "extras": self.extras}
        if self.columns is None:
            return {**pack_columns(self.record), "extras": self.extras}
        return {"record": self.record, "columns": self.columns, "extras": self.extras}


# A staged base snapshot as a store freezes it: its JSON, or the call as the store parsed it.
StagedSnapshotLine: TypeAlias = bytes | ParsedStagedCall


@dataclass(frozen=True, slots=True)
class StagedLines:
    """A frozen staging rollout as stored: its manifest and, per manifest record in order,
    the staged call's base snapshot as JSON (no extras), None when it was never staged.

    A store that has to parse a stored line to cut its extras off (the file
    store) hands the parsed call on instead, extras included: the freeze
    answer then carries them, and no second read is needed for the extras
    check (docs/staging.md#packed-columns).
    """

    manifest: RolloutManifest
    snapshots: tuple[StagedSnapshotLine | None, ...]


@dataclass(frozen=True, slots=True)
class FrozenLines:
    """A frozen snapshot as its stored entry lines, unparsed (what the store server sends on).

    `lines` are canonical lines, or, from `freeze_lines(stored=True)`, the values
    as stored: packed records (`sources/_packed.py`) beside plain lines, in put
    order (docs/store-protocol.md#compact-freeze). A staging rollout has no
    lines: `staged` holds its manifest and snapshots.
    """

    rollout_id: str
    lines: tuple[bytes, ...]
    incomplete: bool
    snapshot_id: str
    version: int
    staged: StagedLines | None = None


@dataclass(frozen=True, slots=True)
class MemoryHealth:
    """A store's memory as /health and /ready report it (docs/capacity.md).

    `status` is None while healthy, else `"memory_full"` (above the high-water
    mark: writes that add capture data are refused, freeze and retire work)
    or `"captures_evicted"` (Redis evicted keys while this process ran);
    `memory` is `{"used", "max", "fraction", "high_water"}`; `evicted_keys`
    counts the evictions since this process started.
    """

    status: str | None
    memory: dict[str, Any]
    evicted_keys: int = 0


@dataclass(frozen=True, slots=True)
class LineageQuery:
    """A lineage/resolve request in its wire form (docs/store-protocol.md#lineage-resolve).

    `context_digests[k]` is the conversation digest of the request's first k
    items; the store compares strings, it never sees the items.
    """

    fingerprint_version: int
    fingerprint: str
    context_digests: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class StagingReport:
    """What a staging rollout holds, for `store inspect`.

    `records` are the committed calls (ledger order), `failures` the failure
    rows as (call id, reason), `staged` the number of staged calls, `orphans`
    the staged calls no committed row names (a lost acknowledgement),
    `cleared` the number of staged calls a clear deleted.
    """

    ledger_rows: int
    records: tuple[str, ...]
    failures: tuple[tuple[str, str], ...]
    staged: int
    orphans: tuple[str, ...]
    cleared: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "ledger_rows": self.ledger_rows,
            "committed_calls": list(self.records),
            "failures": [{"model_call_id": call, "reason": why} for call, why in self.failures],
            "staged_calls": self.staged,
            "orphans": list(self.orphans),
            "cleared_calls": self.cleared,
        }


@dataclass(frozen=True, slots=True)
class CaptureReport:
    """One capture as an operator needs to see it (`store inspect`), the same on every backend.

    `details` holds what only one backend can tell (the file store's file sizes,
    Redis's key names and timestamps); `to_dict` lays it beside the common fields.
    """

    rollout_id: str
    store: str
    frozen: bool
    retired: bool
    snapshot_id: str | None
    version: int
    entries: int
    marked_incomplete: bool
    incomplete_call_ids: tuple[str, ...]
    missing_call_ids: tuple[str, ...]
    announced_calls: int
    details: Mapping[str, Any] = field(default_factory=dict)
    staging: StagingReport | None = None

    @classmethod
    def of_state(
        cls,
        rollout_id: str,
        store: str,
        state: CaptureState,
        *,
        entries: int,
        incomplete_call_ids: tuple[str, ...],
        missing_call_ids: tuple[str, ...],
        announced_calls: int,
        details: Mapping[str, Any] | None = None,
        staging: StagingReport | None = None,
    ) -> CaptureReport:
        """The report of a capture in `state`; every backend counts the rest its own way."""
        return cls(
            rollout_id=rollout_id,
            store=store,
            frozen=state.frozen,
            retired=state.retired,
            snapshot_id=state.snapshot_id,
            version=state.version,
            entries=entries,
            marked_incomplete=state.incomplete,
            incomplete_call_ids=incomplete_call_ids,
            missing_call_ids=missing_call_ids,
            announced_calls=announced_calls,
            details={} if details is None else details,
            staging=staging,
        )

    @property
    def state(self) -> str:
        """`open`, `frozen` or `retired`."""
        return "retired" if self.retired else "frozen" if self.frozen else "open"

    @property
    def incomplete_reasons(self) -> list[str]:
        """Why a freeze would call the capture incomplete, in words (empty when complete)."""
        reasons = []
        if self.marked_incomplete:
            reasons.append("the capture was marked incomplete")
        if self.incomplete_call_ids:
            reasons.append(f"{len(self.incomplete_call_ids)} call(s) failed to capture")
        if self.missing_call_ids:
            reasons.append(f"{len(self.missing_call_ids)} announced call(s) have no entry")
        return reasons

    def to_dict(self) -> dict[str, Any]:
        """The JSON object `store inspect` prints."""
        reasons = self.incomplete_reasons
        report: dict[str, Any] = {
            "rollout_id": self.rollout_id,
            "store": self.store,
            "state": self.state,
            "frozen": self.frozen,
            "retired": self.retired,
            "snapshot_id": self.snapshot_id,
            "version": self.version,
            "entries": self.entries,
            "incomplete": bool(reasons),
            "incomplete_reasons": reasons,
            "incomplete_call_ids": list(self.incomplete_call_ids),
            "missing_call_ids": list(self.missing_call_ids),
            "announced_calls": self.announced_calls,
        }
        if self.staging is not None:
            report["staging"] = self.staging.to_dict()
        report.update(self.details)
        return report


@dataclass(frozen=True, slots=True)
class SweepRules:
    """Which captures a sweep removes, by age in seconds (docs/store-protocol.md#sweep).

    Retired tombstones older than `retired_older_than` always; captures never
    frozen and quiet for `abandoned_older_than`, and frozen captures holding
    nothing for `empty_older_than`, only when those are set. A frozen capture
    with anything in it that was not retired is evidence: never removed.
    """

    retired_older_than: float
    abandoned_older_than: float | None = None
    empty_older_than: float | None = None

    def reason(self, state: CaptureState, age: float, *, holds_nothing: bool) -> str | None:
        """Why a capture of this state and age goes (`retired`, `abandoned`, `empty`), or None."""
        if state.retired:
            return "retired" if age >= self.retired_older_than else None
        if not state.frozen:
            limit = self.abandoned_older_than
            return "abandoned" if limit is not None and age >= limit else None
        limit = self.empty_older_than
        return "empty" if limit is not None and age >= limit and holds_nothing else None


@dataclass(frozen=True, slots=True)
class SweptCapture:
    """One capture that a sweep removed (or would remove, in a dry run)."""

    rollout_id: str
    reason: str  # "retired", "abandoned" or "empty"
    age_seconds: float


@dataclass(frozen=True, slots=True)
class SweptLeftover:
    """A leftover a sweep removed outside any capture removal (the file store's stale files)."""

    name: str
    reason: str  # "temp", "orphan" (data files of a retired capture) or "lock" (a lone lock)
    age_seconds: float


@dataclass(frozen=True, slots=True)
class Skipped:
    """Something a sweep left alone because it cannot be trusted: its name and why."""

    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class SweepReport:
    """Everything one sweep did (or would do, in a dry run)."""

    captures: tuple[SweptCapture, ...] = ()
    leftovers: tuple[SweptLeftover, ...] = ()
    skipped: tuple[Skipped, ...] = ()


# -- protocols ------------------------------------------------------------------------


@runtime_checkable
class CaptureSource(Protocol):
    """Where a finished rollout's capture is frozen and retired (the finalizer's side)."""

    async def freeze(self, rollout_id: str) -> Snapshot:
        """Freeze the rollout (idempotent) and return its immutable snapshot."""
        ...

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        """Retire exactly that snapshot; False when the store moved on since."""
        ...

    async def ping(self) -> None:
        """Return when the store can be reached now; raise SourceUnavailable otherwise."""
        ...

    async def memory_health(self) -> MemoryHealth | None:
        """The store's memory (a Redis store, or a store server over one); None otherwise.

        Called after a successful `ping` (it may reuse what the ping read).
        """
        ...

    async def close(self) -> None:
        """Release resources; safe to call twice."""
        ...

    async def fetch_extras(self, rollout_id: str, call_ids: Sequence[str]) -> StagedExtras:
        """The extras of these staged calls (a call not staged is absent from the answer)."""
        ...


class CaptureSink(Protocol):
    """Where model servers record each call's tokens while a rollout runs."""

    async def put(self, entry: TokenEntry | Mapping[str, Any]) -> None:
        """Store one call; the same payload again is a no-op, a different one CaptureConflict."""
        ...

    async def mark_incomplete(self, rollout_id: str, model_call_id: str = "") -> None:
        """Record that a call of this rollout failed to capture (allowed after a freeze)."""
        ...

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        """Announce a call; a snapshot missing its entry at freeze time is incomplete."""
        ...

    async def close(self) -> None:
        """Release resources; safe to call twice."""
        ...


class StoreAdmin(Protocol):
    """An operator's view of one local store; every method reads or changes under the
    store's own atomicity (a lock, a script), so it is safe beside live writers."""

    async def status(self, rollout_id: str) -> CaptureState | None:
        """The stored state of one rollout, or None when nothing is stored."""
        ...

    async def inspect(self, rollout_id: str) -> CaptureReport | None:
        """One capture's report, or None when nothing is stored (CaptureCorrupt if unreadable)."""
        ...

    async def delete(self, rollout_id: str) -> tuple[str, ...]:
        """Remove every trace of one rollout, tombstone included; the names removed."""
        ...

    async def sweep(
        self, rules: SweepRules, *, dry_run: bool = False, now: float | None = None
    ) -> SweepReport:
        """Remove what `rules` select (nothing in a dry run); skip and report what is untrusted."""
        ...

    async def rollout_ids(self) -> list[str]:
        """Every rollout the store holds anything of, sorted."""
        ...


class StagingStore(Protocol):
    """NeMo Gym 0.7's external staging in one store (docs/staging.md#storage).

    Every write refuses a frozen rollout (CaptureFrozen), a retired one
    (CaptureRetired) and one holding token entries (CaptureConflict), and is
    durable before it returns. Reads of an unknown or retired rollout find
    nothing.
    """

    async def record_ledger_row(self, rollout_id: str, row: Mapping[str, Any]) -> bool:
        """Append a committed ledger row, write-once per call id across both row kinds.

        True when appended, False for an identical replay; CaptureConflict for
        any difference (or a failure row stored first for that call);
        StagingRecordError for a row that is not one `commit_row` makes.
        """
        ...

    async def record_ledger_failure(self, rollout_id: str, model_call_id: str, reason: str) -> bool:
        """Append a failure row; False when that (call, reason) row is already stored."""
        ...

    async def ledger_has_rows(self, rollout_id: str) -> bool:
        """Whether the rollout's ledger holds any row."""
        ...

    async def ledger_manifest(self, rollout_id: str) -> RolloutManifest:
        """The manifest of the rollout's ledger (empty lists when it holds no row)."""
        ...

    async def resolve_ledger(self, rollout_id: str, query: LineageQuery) -> LedgerResolution | None:
        """Which committed row a request continues, over the fingerprint's rows only;
        None when the rollout holds no ledger row (it may hold token entries)."""
        ...

    async def stage(
        self, record: StagedCallRecord, attachments: Mapping[str, Attachment] | None = None
    ) -> bool:
        """Store one staged call with its attachments, after the custody checks.

        True when stored, False for an identical replay; CustodyRefusal naming
        the failed check (nothing stored); CaptureConflict for another payload
        under the same call id; StagingRecordError for malformed attachments.
        """
        ...

    async def fetch_staged(
        self, rollout_id: str, call_ids: Sequence[str]
    ) -> tuple[bytes | None, ...]:
        """Each call's base snapshot as JSON (no extras), in order; None when not staged."""
        ...

    async def fetch_attachments(
        self, rollout_id: str, model_call_id: str
    ) -> dict[str, Attachment] | None:
        """The call's attachments as staged ({} when it staged none); None when not staged."""
        ...

    async def clear_staged(self, rollout_id: str, call_ids: Sequence[str]) -> int:
        """Delete exactly these staged calls (record, extras, attachments); how many were held.

        Idempotent: a call that is not staged (never, or cleared already) and
        a retired or unknown rollout are no error and change nothing. Ledger
        rows stay. A cleared call id is kept as a tombstone, so the call
        cannot be staged again (CaptureConflict): write-once holds across a
        clear. CaptureFrozen for a frozen rollout, whose staged calls belong
        to its snapshot until it is retired (docs/staging.md#clearing-staged-calls).
        """
        ...


@runtime_checkable
class CaptureStore(CaptureSource, CaptureSink, StagingStore, Protocol):
    """A local store: both sides, what the store server serves, and its admin."""

    #: Shown in reports and logs: `memory`, `file` or `redis`.
    kind: str

    @property
    def admin(self) -> StoreAdmin:
        """The operator's view of this store."""
        ...

    async def freeze_lines(self, rollout_id: str, *, stored: bool = False) -> FrozenLines:
        """`freeze`, answering the stored entry lines unparsed (the store server's fast path);
        with `stored`, the values as stored (packed records unexpanded: the compact freeze)."""
        ...

    async def resolve_lineage(self, rollout_id: str, query: LineageQuery) -> Resolution:
        """Which committed call a request continues, read without freezing (never raises
        for a broken capture: that is `unresolved` with reason `lookup_error`)."""
        ...
