"""External staging in the redis store: the ledger and the staged calls of each rollout.

Every key is under the rollout's hash tag (`_client` lists them), and each
state change is one Lua script: a ledger row (`ledger_record`), a failure
row (`ledger_failure`), a staged call (`stage`), each refusing a frozen or
retired rollout and one holding token entries, each bumping the version and
the abandoned-capture expiry as a put does. Reads are read-only scripts.

A stage is checked before its script runs: `staged_chain` names the calls
above it with their staging digests, this process parses the ones it does
not hold yet (`StagedCallCache`: staged calls are immutable), the custody
check runs here, and the `stage` script then stores the call only if its
parent is still the one that was checked. Resolution reads only the rows of
the request's fingerprint (`ledger_fp`). See docs/staging.md#storage.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from token_finalizer._constants import REDIS_PUT_ROUNDS
from token_finalizer.core.codec import loads_json
from token_finalizer.core.errors import CaptureConflict, CaptureCorrupt, SourceUnavailable
from token_finalizer.core.identity import check_model_call_id, check_store_id
from token_finalizer.core.staging import (
    LedgerResolution,
    RolloutManifest,
    StagedCallBaseSnapshot,
    StagedCallRecord,
    StagingRecordError,
    check_custody,
    manifest_from_rows,
    resolve_ledger,
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
    ledger_line,
    staged_lines,
    staging_refused,
    staging_report,
)
from token_finalizer.sources._staging_index import StagedCallCache
from token_finalizer.sources._state import CaptureState
from token_finalizer.sources.base import (
    Attachment,
    LineageQuery,
    StagedExtras,
    StagedLines,
    StagingReport,
)
from token_finalizer.sources.redis._client import RedisConnection, text

__all__ = ["RedisStaging"]


class RedisStaging:
    """The StagingStore methods over one redis store's connection."""

    def __init__(self, redis: RedisConnection, *, abandoned_ms: int) -> None:
        self._redis = redis
        self._abandoned_ms = abandoned_ms
        self._calls = StagedCallCache()

    def _refused(self, reply: Any, rollout_id: str, what: str) -> SourceUnavailable:
        """Raise what a write script's refusal means; the error for an unknown reply."""
        status = reply[0] if reply else None
        if status in (b"frozen", b"retired"):
            CaptureState(frozen=True, retired=status == b"retired").check_writable(rollout_id)
        if status == b"family":
            raise staging_refused(rollout_id)
        return self._redis.unexpected(what, reply)

    def _rows(self, raw: Sequence[bytes], rollout_id: str) -> list[dict[str, Any]]:
        rows = []
        for line in raw:
            try:
                row = loads_json(line)
            except ValueError as error:
                raise CaptureCorrupt(
                    f"rollout {rollout_id}: unreadable ledger row ({error})"
                ) from None
            if not isinstance(row, dict):
                raise CaptureCorrupt(f"rollout {rollout_id}: a ledger row is not an object")
            rows.append(row)
        return rows

    # -- the ledger ----------------------------------------------------------------------

    async def record_ledger_row(self, rollout_id: str, row: Mapping[str, Any]) -> bool:
        """Append a committed row (write-once); False for an identical replay."""
        checked = checked_ledger_row(row)
        call_id = checked["model_call_id"]
        args = (call_id, ledger_line(checked), checked["fingerprint"], self._abandoned_ms)
        reply = await self._redis.run("ledger_record", rollout_id, args, "ledger record")
        if reply[0] == b"new":
            return True
        if reply[0] == b"same":
            return False
        if reply[0] == b"conflict":
            raise CaptureConflict(
                f"rollout {rollout_id}: conflicting ledger row for model call {call_id}"
            )
        raise self._refused(reply, rollout_id, "ledger record")

    async def record_ledger_failure(self, rollout_id: str, model_call_id: str, reason: str) -> bool:
        """Append a failure row; False when that (call, reason) row is stored."""
        row = checked_failure_row(model_call_id, reason)
        marker = "\n" + json.dumps([model_call_id, reason])
        args = (model_call_id, ledger_line(row), marker, self._abandoned_ms)
        reply = await self._redis.run("ledger_failure", rollout_id, args, "ledger failure")
        if reply[0] in (b"new", b"same"):
            return bool(reply[0] == b"new")
        raise self._refused(reply, rollout_id, "ledger failure")

    async def ledger_has_rows(self, rollout_id: str) -> bool:
        """Whether the rollout's ledger holds any row."""
        count = await self._redis.run("ledger_rows", rollout_id, ("count",), "ledger rows")
        return int(count) > 0

    async def ledger_manifest(self, rollout_id: str) -> RolloutManifest:
        """The manifest of the rollout's ledger."""
        raw = await self._redis.run("ledger_rows", rollout_id, ("rows",), "ledger rows")
        return self._manifest(self._rows(raw, rollout_id), rollout_id)

    @staticmethod
    def _manifest(rows: list[dict[str, Any]], rollout_id: str) -> RolloutManifest:
        try:
            return manifest_from_rows(rollout_id, rows)
        except StagingRecordError as error:
            raise CaptureCorrupt(f"rollout {rollout_id}: {error}") from None

    async def resolve_ledger(self, rollout_id: str, query: LineageQuery) -> LedgerResolution | None:
        """Resolution over the ledger rows of the request's fingerprint; None without rows."""
        reply = await self._redis.run(
            "ledger_resolve", rollout_id, (query.fingerprint,), "ledger resolve"
        )
        if reply[0] == b"none":
            return None
        if reply[0] != b"ok" or len(reply) != 2:
            raise self._redis.unexpected("ledger resolve", reply)
        rows = self._rows(reply[1], rollout_id)
        return resolve_ledger(rows, query.fingerprint, query.context_digests)

    # -- staged calls --------------------------------------------------------------------

    async def _ancestors(
        self, rollout_id: str, parent_call_id: str
    ) -> list[StagedCallBaseSnapshot]:
        """The staged calls from the root down to `parent_call_id` (cut at a missing one)."""
        flat = await self._redis.run("staged_chain", rollout_id, (parent_call_id,), "staged chain")
        chain = [(text(flat[i]), text(flat[i + 1])) for i in range(0, len(flat) - 1, 2)]
        chain.reverse()
        found = {digest: self._calls.get(digest) for _, digest in chain}
        missing = [call_id for call_id, digest in chain if found[digest] is None]
        if missing:
            lines = await self._read("base", rollout_id, missing)
            for call_id, line in zip(missing, lines, strict=True):
                if line is not None:
                    snapshot = self._parsed(line, rollout_id, call_id)
                    self._calls.put(snapshot)
                    found[snapshot.digest] = snapshot
        ancestors: list[StagedCallBaseSnapshot] = []
        for _, digest in chain:
            ancestor = found.get(digest)
            if ancestor is None:
                ancestors = []  # gone meanwhile: the chain starts below it
            else:
                ancestors.append(ancestor)
        return ancestors

    @staticmethod
    def _parsed(stored: bytes, rollout_id: str, call_id: str) -> StagedCallBaseSnapshot:
        try:
            return stored_snapshot(base_from_stored(stored))
        except (ValueError, TypeError) as error:
            raise CaptureCorrupt(
                f"staged call {call_id} of rollout {rollout_id} cannot be read: {error}"
            ) from None

    async def stage(
        self, record: StagedCallRecord, attachments: Mapping[str, Attachment] | None = None
    ) -> bool:
        """Store a staged call after the custody checks; False for an identical replay."""
        rollout_id, call_id = check_store_id(record.rollout_id), record.model_call_id
        check_model_call_id(call_id)
        checked = checked_attachments(attachments)
        data = StagedCallBaseSnapshot.to_json(record, native_columns=True)
        base, rest = base_json_of(data), extras_json(record, checked)
        packed = pack_base(data, base)
        parent = record.parent_call_id
        for _ in range(REDIS_PUT_ROUNDS):
            ancestors = [] if parent is None else await self._ancestors(rollout_id, parent)
            check_custody(record, ancestors)
            parent_digest = ancestors[-1].digest if ancestors else ""
            args = (
                call_id,
                parent or "",
                parent_digest,
                packed,
                rest,
                record.digest,
                self._abandoned_ms,
            )
            reply = await self._redis.run("stage", rollout_id, args, "stage")
            if reply[0] == b"new":
                self._calls.put(record.base_snapshot())
                return True
            if reply[0] == b"same":
                return False
            if reply[0] == b"conflict":
                if self._replayed(reply, base, rest):
                    return False
                raise CaptureConflict(
                    f"call {call_id} of rollout {rollout_id} was already staged "
                    "with a different payload"
                )
            if reply[0] == b"cleared":
                raise cleared_conflict(rollout_id, call_id)
            if reply[0] != b"parent_changed":
                raise self._refused(reply, rollout_id, "stage")
        raise SourceUnavailable(
            f"redis store {self._redis.where}: the parent of call {call_id} of rollout "
            f"{rollout_id} kept changing during the stage"
        )

    @staticmethod
    def _replayed(reply: Any, base: bytes, rest: bytes) -> bool:
        """Whether a stored call the script could not match by bytes is this very call.

        A call stored in another form (its base JSON, as before 0.5.0) staged
        again is an identical replay, not a conflict.
        """
        if len(reply) != 3 or bytes(reply[2]) != rest:
            return False
        try:
            return expand_base(bytes(reply[1])) == base
        except ValueError:
            return False

    async def _read(
        self, part: str, rollout_id: str, call_ids: Sequence[str]
    ) -> list[bytes | None]:
        if not call_ids:
            return []
        reply = await self._redis.run("staged_read", rollout_id, (part, *call_ids), "staged calls")
        if not reply:  # retired: nothing is staged any more
            return [None] * len(call_ids)
        return [value if value else None for value in reply]

    async def fetch_staged(
        self, rollout_id: str, call_ids: Sequence[str]
    ) -> tuple[bytes | None, ...]:
        """Each call's base snapshot JSON, in order; None when not staged."""
        stored = await self._read("base", rollout_id, list(call_ids))
        return tuple(
            None if value is None else self._expanded(value, rollout_id) for value in stored
        )

    @staticmethod
    def _expanded(stored: bytes, rollout_id: str) -> bytes:
        """A stored base snapshot as its JSON, byte for byte as staged."""
        try:
            return expand_base(stored)
        except ValueError as error:
            raise CaptureCorrupt(
                f"a staged call of rollout {rollout_id} cannot be read: {error}"
            ) from None

    def _rest(self, line: bytes, rollout_id: str, call_id: str) -> dict[str, Any]:
        try:
            rest = loads_json(line)
            if not isinstance(rest, dict):
                raise TypeError("not an object")
        except (ValueError, TypeError) as error:
            raise CaptureCorrupt(
                f"the extras of staged call {call_id} of rollout {rollout_id} "
                f"cannot be read: {error}"
            ) from None
        return rest

    async def fetch_extras(self, rollout_id: str, call_ids: Sequence[str]) -> StagedExtras:
        """The extras of the staged calls among `call_ids`."""
        ids = list(call_ids)
        lines = await self._read("rest", rollout_id, ids)
        return {
            call_id: self._rest(line, rollout_id, call_id).get("extras")
            for call_id, line in zip(ids, lines, strict=True)
            if line is not None
        }

    async def fetch_attachments(
        self, rollout_id: str, model_call_id: str
    ) -> dict[str, Attachment] | None:
        """The call's attachments ({} when it staged none); None when not staged."""
        (line,) = await self._read("rest", rollout_id, [model_call_id])
        if line is None:
            return None
        return dict(self._rest(line, rollout_id, model_call_id).get("attachments") or {})

    async def clear_staged(self, rollout_id: str, call_ids: Sequence[str]) -> int:
        """Delete exactly these staged calls in one script; how many were held (idempotent)."""
        check_store_id(rollout_id)
        ids = cleared_call_ids(call_ids)
        if not ids:
            return 0
        reply = await self._redis.run(
            "staged_clear", rollout_id, (self._abandoned_ms, *ids), "staged clear"
        )
        if reply[0] == b"frozen":
            raise clear_refused(rollout_id)
        if reply[0] != b"ok" or len(reply) != 2:
            raise self._redis.unexpected("staged clear", reply)
        return int(reply[1])

    # -- the freeze and inspect ----------------------------------------------------------

    async def frozen_lines(self, rollout_id: str) -> StagedLines | None:
        """After a freeze: the manifest and each record's base JSON; None for a token rollout."""
        reply = await self._redis.run("staging_freeze", rollout_id, (), "staged freeze")
        if reply[0] == b"none":
            return None
        if reply[0] == b"retired":
            CaptureState(frozen=True, retired=True).check_writable(rollout_id)
        if reply[0] != b"ok" or len(reply) != 3:
            raise self._redis.unexpected("staged freeze", reply)
        rows = self._rows(reply[1], rollout_id)
        pairs = reply[2]
        bases = {
            text(pairs[i]): self._expanded(bytes(pairs[i + 1]), rollout_id)
            for i in range(0, len(pairs) - 1, 2)
        }
        return staged_lines(self._manifest(rows, rollout_id), bases.get)

    async def report(self, rollout_id: str) -> StagingReport | None:
        """What `store inspect` shows; None when the rollout holds no staging."""
        raw_rows, staged, cleared = await self._redis.run(
            "ledger_rows", rollout_id, ("inspect",), "ledger rows"
        )
        if not raw_rows and not staged and not cleared:
            return None
        rows = self._rows(raw_rows, rollout_id)
        return staging_report(rows, sorted(map(text, staged)), int(cleared))
