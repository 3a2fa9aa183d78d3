"""Capture-ledger rows: their form, write-once rules, the manifest and parent resolution.

A rollout's ledger is an append-only list of rows (docs/staging.md#ledger-rows-and-manifest):

- a **committed row** per staged call the model server committed: the
  manifest row's custody columns, the staging chain (ancestors and self),
  and the lookup keys of parent resolution (``fingerprint`` over request and
  response items, ``context_len`` and ``context_digest`` over the request);
- a **failure row** ``{"failure_reason", "model_call_id"}`` per call whose
  capture did not complete.

The row dicts are NeMo Gym 0.7.0's ledger rows key for key, so stores can
persist them as sorted-key JSON and compare them for write-once. Stores
decide writes with ``plan_commit`` / ``plan_failure``, build the manifest
with ``manifest_from_rows`` and resolve parents with ``resolve_ledger``;
nothing here performs I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from token_finalizer.core.lineage_resolution import RESOLVED, ROOT, UNRESOLVED
from token_finalizer.core.staging._wire import Fields, StagingRecordError
from token_finalizer.core.staging.digests import is_hex_digest
from token_finalizer.core.staging.manifest import (
    LEDGER_ROW_MISSING_CHAIN_HASH_REASON,
    LEDGER_ROW_MISSING_RESPONSE_ID_REASON,
    CallRecord,
    ManifestFailure,
    RolloutManifest,
)
from token_finalizer_client.protocol import (
    FINGERPRINT_VERSION,
    FingerprintError,
    assistant_fingerprint,
    context_digests,
)

__all__ = [
    "LedgerConflict",
    "LedgerMatch",
    "LedgerResolution",
    "LedgerWrite",
    "commit_row",
    "failure_row",
    "manifest_from_rows",
    "plan_commit",
    "plan_failure",
    "resolve_ledger",
    "resolve_ledger_items",
]

LedgerRow = Mapping[str, Any]

_LOOKUP_ERROR = "lookup_error"


class LedgerConflict(ValueError):
    """A write would give a call id a second, different committed row."""


class LedgerWrite(enum.Enum):
    """What a store does with a row it was asked to write."""

    APPEND = "append"  # new: append it
    REPLAY = "replay"  # identical to what is stored: nothing to do, answer success


def commit_row(
    record: CallRecord,
    *,
    staging_chain: Sequence[str],
    fingerprint: str,
    context_len: int,
    context_digest: str,
) -> dict[str, Any]:
    """The committed ledger row of ``record``; the lookup keys come computed by the caller.

    ``fingerprint`` is ``assistant_fingerprint(request_items + response_items)``
    ("" when neither holds model-authored content), ``context_len`` the number
    of request items and ``context_digest`` their ``conversation_digest``.
    The row's ``digest`` is the call's ``cumulative_hash``; the staging digest
    is kept as ``staging_digest``.
    """
    fields = Fields("LedgerRow")
    chain = list(fields.items("staging_chain", staging_chain, _chain_key(fields)))
    if type(fingerprint) is not str or (fingerprint and not is_hex_digest(fingerprint)):
        raise fields.fail("fingerprint", "must be '' or 64 lowercase hex characters")
    fields.count("context_len", context_len)
    fields.digest("context_digest", context_digest)
    return {
        "model_call_id": record.model_call_id,
        "fingerprint": fingerprint,
        "context_len": context_len,
        "context_digest": context_digest,
        "digest": record.cumulative_hash,
        "parent_call_id": record.parent_call_id,
        "staging_key": record.staging_key,
        "weight_version": record.weight_version,
        "prev_len": record.prev_len,
        "delta_len": record.delta_len,
        "cum_len": record.cum_len,
        "staging_digest": record.digest,
        "extras_digest": record.extras_digest,
        "mode": record.mode,
        "admitted_at": record.admitted_at,
        "staging_chain": chain,
        "chain_hash": record.chain_hash,
        "cumulative_hash": record.cumulative_hash,
        "response_id": record.response_id,
        "output_fingerprint": record.output_fingerprint,
        "continuation_fingerprint": record.continuation_fingerprint,
        "fingerprint_version": record.fingerprint_version,
    }


def _chain_key(fields: Fields) -> Any:
    def read(key: object) -> str:
        return fields.identifier("staging_chain", key)

    return read


def failure_row(model_call_id: str, reason: str) -> dict[str, Any]:
    """The failure row of a call whose capture did not complete."""
    fields = Fields("LedgerRow")
    fields.identifier("model_call_id", model_call_id)
    fields.identifier("failure_reason", reason)
    return {"failure_reason": reason, "model_call_id": model_call_id}


def plan_commit(existing: Iterable[LedgerRow], row: LedgerRow) -> LedgerWrite:
    """Write-once for committed rows, across both row kinds.

    ``existing`` are the rollout's stored rows (only those of the row's call
    id matter). The first stored row of that id decides: the identical row is
    a replay; anything else, a failure row included, raises ``LedgerConflict``.
    Every field counts, ``admitted_at`` too.
    """
    call_id = row["model_call_id"]
    for stored in existing:
        if stored.get("model_call_id") == call_id:
            if dict(stored) != dict(row):
                raise LedgerConflict(f"conflicting ledger row for model call {call_id}")
            return LedgerWrite.REPLAY
    return LedgerWrite.APPEND


def plan_failure(existing: Iterable[LedgerRow], row: LedgerRow) -> LedgerWrite:
    """Failure rows are idempotent per identical (call id, reason); anything else appends.

    A new reason for the same call, or a failure after the call's committed
    row, is a further row: the manifest then lists it and the rollout is
    poisoned.
    """
    if any(dict(stored) == dict(row) for stored in existing):
        return LedgerWrite.REPLAY
    return LedgerWrite.APPEND


def manifest_from_rows(rollout_id: str, rows: Iterable[LedgerRow]) -> RolloutManifest:
    """The rollout's manifest: committed rows as records, failures, each in ledger order.

    A committed row without a ``response_id`` or without both chain hashes
    becomes a failure (``ledger_row_missing_response_id`` /
    ``ledger_row_missing_chain_hash``) instead of a record. A row that is
    neither kind (no ``failure_reason``, no ``staging_key``) is not part of a
    manifest. A row whose columns do not make a valid ``CallRecord`` raises
    ``StagingRecordError``.
    """
    records: list[CallRecord] = []
    failures: list[ManifestFailure] = []
    for row in rows:
        call_id = str(_column(row, "model_call_id"))
        if row.get("failure_reason") is not None:
            reason = str(row["failure_reason"])
            failures.append(ManifestFailure(model_call_id=call_id, reason=reason))
        elif row.get("staging_key") is not None:
            if not row.get("response_id"):
                reason = LEDGER_ROW_MISSING_RESPONSE_ID_REASON
                failures.append(ManifestFailure(model_call_id=call_id, reason=reason))
            elif not row.get("chain_hash") or not row.get("cumulative_hash"):
                reason = LEDGER_ROW_MISSING_CHAIN_HASH_REASON
                failures.append(ManifestFailure(model_call_id=call_id, reason=reason))
            else:
                records.append(_record_of(row))
    return RolloutManifest(rollout_id=rollout_id, records=tuple(records), failures=tuple(failures))


def _column(row: LedgerRow, name: str) -> Any:
    try:
        return row[name]
    except KeyError:
        raise StagingRecordError("LedgerRow", name, "field required") from None


def _record_of(row: LedgerRow) -> CallRecord:
    return CallRecord(
        model_call_id=_column(row, "model_call_id"),
        parent_call_id=row.get("parent_call_id"),
        prev_len=_column(row, "prev_len"),
        delta_len=_column(row, "delta_len"),
        cum_len=_column(row, "cum_len"),
        weight_version=_column(row, "weight_version"),
        digest=_column(row, "staging_digest"),
        extras_digest=_column(row, "extras_digest"),
        staging_key=_column(row, "staging_key"),
        mode=_column(row, "mode"),
        chain_hash=_column(row, "chain_hash"),
        cumulative_hash=_column(row, "cumulative_hash"),
        response_id=_column(row, "response_id"),
        admitted_at=row.get("admitted_at"),
        output_fingerprint=row.get("output_fingerprint") or None,
        continuation_fingerprint=row.get("continuation_fingerprint") or None,
        fingerprint_version=row.get("fingerprint_version") or 0,
    )


@dataclass(frozen=True, slots=True)
class LedgerMatch:
    """The committed call a request continues, as a model server needs it.

    ``digest`` is the call's cumulative hash, ``prev_len`` its ``cum_len`` (the
    child's carry starts there), ``staging_chain`` the keys whose deltas form
    the child's prefix, ``chain_hash`` the hash the child chains onto.
    """

    model_call_id: str
    digest: str
    staging_chain: tuple[str, ...]
    prev_len: int
    chain_hash: str

    def to_json(self) -> dict[str, Any]:
        """The wire form; ``cumulative_token_ids`` is always empty for ledger rows."""
        return {
            "model_call_id": self.model_call_id,
            "cumulative_token_ids": [],
            "digest": self.digest,
            "staging_chain": list(self.staging_chain),
            "prev_len": self.prev_len,
            "chain_hash": self.chain_hash,
        }


@dataclass(frozen=True, slots=True)
class LedgerResolution:
    """``root`` / ``resolved`` / ``unresolved``, the reason, and the match when resolved."""

    status: str
    reason: str
    match: LedgerMatch | None


def resolve_ledger_items(
    rows: Iterable[LedgerRow], request_items: Sequence[Any]
) -> LedgerResolution:
    """Resolve a request given as items (its fingerprint and context digests are computed here)."""
    try:
        fingerprint = assistant_fingerprint(request_items)
        if not fingerprint:
            return LedgerResolution(ROOT, "", None)
        digests = context_digests(request_items)
    except FingerprintError:
        return LedgerResolution(UNRESOLVED, _LOOKUP_ERROR, None)
    return resolve_ledger(rows, fingerprint, digests)


def resolve_ledger(
    rows: Iterable[LedgerRow], fingerprint: str, context_digests: Sequence[str]
) -> LedgerResolution:
    """Which committed call a request continues, over a rollout's ledger rows.

    The request is in its wire form: its assistant fingerprint and
    ``context_digests[k]`` = conversation digest of its first k items. A
    committed row is a candidate when its fingerprint (version 2) equals the
    request's and the request starts with exactly the row's request context.
    Candidates that all name one sequence (same non-empty cumulative hash and
    ``cum_len``) collapse to the smallest call id, so an identical retry
    resolves. None: ``no_match``; several different: ``ambiguous``; a row that
    cannot be read: ``lookup_error``. Never raises for a broken row.

    ``rows`` may be all of the rollout's rows or only those a store indexed
    under the request's fingerprint: other rows never match.
    """
    if not fingerprint:
        return LedgerResolution(ROOT, "", None)
    try:
        candidates: dict[str, LedgerRow] = {}
        for row in rows:
            if _continues(row, fingerprint, context_digests):
                candidates.setdefault(str(row["model_call_id"]), row)
        if len(candidates) > 1 and _one_sequence(candidates.values()):
            smallest = min(candidates)
            candidates = {smallest: candidates[smallest]}
        if not candidates:
            return LedgerResolution(UNRESOLVED, "no_match", None)
        if len(candidates) > 1:
            return LedgerResolution(UNRESOLVED, "ambiguous", None)
        ((call_id, row),) = candidates.items()
        return LedgerResolution(RESOLVED, "", _match(call_id, row))
    except Exception:
        # A resolver answers; a malformed stored row makes it unresolved, never an error.
        return LedgerResolution(UNRESOLVED, _LOOKUP_ERROR, None)


def _continues(row: LedgerRow, fingerprint: str, digests: Sequence[str]) -> bool:
    # Failure rows carry no fingerprint, so they never match.
    if row.get("failure_reason") is not None or row.get("fingerprint") != fingerprint:
        return False
    if row.get("fingerprint_version") != FINGERPRINT_VERSION:
        return False
    context_len = row.get("context_len")
    context_digest = row.get("context_digest")
    if type(context_len) is not int or not context_digest:
        return False
    return 0 <= context_len < len(digests) and digests[context_len] == context_digest


def _one_sequence(candidates: Iterable[LedgerRow]) -> bool:
    identities = {(row.get("cumulative_hash"), row.get("cum_len")) for row in candidates}
    if len(identities) != 1:
        return False
    ((cumulative_hash, cum_len),) = identities
    return bool(cumulative_hash) and cum_len is not None


def _match(call_id: str, row: LedgerRow) -> LedgerMatch:
    prev_len = row["cum_len"]
    if type(prev_len) is not int:
        raise ValueError(f"cum_len of {call_id} is not an integer")
    return LedgerMatch(
        model_call_id=call_id,
        digest=str(row["digest"]),
        staging_chain=tuple(str(key) for key in row.get("staging_chain") or ()),
        prev_len=prev_len,
        chain_hash=str(row.get("chain_hash") or ""),
    )
