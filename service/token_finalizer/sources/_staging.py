"""External staging in the local stores: what every backend shares (docs/staging.md#storage).

- the family guard: a rollout holds token entries or staging, never both;
- a committed ledger row, checked and normalized to exactly what
  `core.staging.commit_row` makes, and its stored line (NeMo Gym's
  FileLineageStore format, so either side reads the other's ledger);
- a staged call's stored forms: its base snapshot JSON (what fetch and freeze
  answer), its extras and attachments JSON, the file store's line;
- the custody walk (a new call's staged ancestors, root first);
- a frozen staging rollout parsed for the finalizer, and the inspect report.

Stored forms are canonical (fixed or sorted keys, one encoder), so write-once
compares bytes: an identical replay is the same bytes, anything else differs.
"""

from __future__ import annotations

import binascii
import json
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import orjson

from token_finalizer.core.codec import loads_json
from token_finalizer.core.errors import CaptureConflict, CaptureCorrupt, CaptureFrozen
from token_finalizer.core.identity import check_model_call_id
from token_finalizer.core.staging import (
    CallRecord,
    RolloutManifest,
    StagedCallBaseSnapshot,
    StagedCallRecord,
    StagedCapture,
    StagingRecordError,
    commit_row,
    failure_row,
    stored_snapshot,
    unpack_columns,
)
from token_finalizer.sources._staged_packed import (
    COLUMN_NAMES,
    columns_of,
    pack_columns_blob,
    unpack_columns_blob,
)
from token_finalizer.sources.base import (
    Attachment,
    ParsedStagedCall,
    StagedLines,
    StagedSnapshotLine,
    StagingReport,
)

__all__ = [
    "base_json",
    "base_json_of",
    "checked_attachments",
    "checked_failure_row",
    "checked_ledger_row",
    "clear_refused",
    "cleared_call_ids",
    "cleared_conflict",
    "entries_refused",
    "extras_json",
    "file_line",
    "ledger_line",
    "parse_file_line",
    "parse_staged_call",
    "same_staged_line",
    "staged_ancestors",
    "staged_capture",
    "staged_lines",
    "staging_refused",
    "staging_report",
]

_ROW = "LedgerRow"
_STAGE = "StageRequest"
_ROW_KEYS = frozenset(
    {
        "model_call_id",
        "fingerprint",
        "context_len",
        "context_digest",
        "digest",
        "parent_call_id",
        "staging_key",
        "weight_version",
        "prev_len",
        "delta_len",
        "cum_len",
        "staging_digest",
        "extras_digest",
        "mode",
        "admitted_at",
        "staging_chain",
        "chain_hash",
        "cumulative_hash",
        "response_id",
        "output_fingerprint",
        "continuation_fingerprint",
        "fingerprint_version",
    }
)
# CallRecord's names for the row's columns where they differ.
_RECORD_FIELD_OF_COLUMN = {"staging_digest": "digest"}
_COLUMN_OF_RECORD_FIELD = {"digest": "staging_digest"}


# -- the family guard -------------------------------------------------------------------


def entries_refused(rollout_id: str) -> CaptureConflict:
    """A token-capture write to a rollout that holds staging."""
    return CaptureConflict(
        f"rollout {rollout_id} holds a staging ledger; token entries cannot be added"
    )


def staging_refused(rollout_id: str) -> CaptureConflict:
    """A staging write to a rollout that holds token entries."""
    return CaptureConflict(
        f"rollout {rollout_id} holds token entries; ledger rows and staged calls cannot be added"
    )


# -- clearing staged calls (docs/staging.md#clearing-staged-calls) ----------------------


def cleared_call_ids(call_ids: Iterable[str]) -> list[str]:
    """The call ids of a clear, each checked, each once (first-named order)."""
    return list(dict.fromkeys(check_model_call_id(call_id) for call_id in call_ids))


def clear_refused(rollout_id: str) -> CaptureFrozen:
    """A clear of a frozen rollout: its staged calls belong to the snapshot until retired."""
    return CaptureFrozen(
        f"rollout {rollout_id} is frozen; its staged calls are part of the frozen snapshot "
        "and go with it when it is retired (POST drop), not one by one"
    )


def cleared_conflict(rollout_id: str, call_id: str) -> CaptureConflict:
    """A stage of a call whose staged record was cleared: write-once holds across a clear."""
    return CaptureConflict(
        f"call {call_id} of rollout {rollout_id} was staged and then cleared; "
        "it cannot be staged again"
    )


# -- ledger rows ------------------------------------------------------------------------


def checked_ledger_row(row: object) -> dict[str, Any]:
    """`row` as `commit_row` makes it (values normalized), or StagingRecordError naming a field.

    Every column must be present and no other; the columns must make a valid
    CallRecord; `digest` must be the call's cumulative hash. The call id must
    also pass the store's id rule (InvalidRolloutId).
    """
    if not isinstance(row, Mapping):
        raise StagingRecordError(_ROW, "*", f"must be a JSON object, got {type(row).__name__}")
    for key in row:
        if key not in _ROW_KEYS:
            raise StagingRecordError(_ROW, str(key), "unknown field")
    missing = sorted(_ROW_KEYS - row.keys())
    if missing:
        raise StagingRecordError(_ROW, missing[0], "field required")
    check_model_call_id(row["model_call_id"])
    columns = {
        _RECORD_FIELD_OF_COLUMN.get(name, name): row[name]
        for name in (
            "model_call_id",
            "parent_call_id",
            "prev_len",
            "delta_len",
            "cum_len",
            "weight_version",
            "staging_digest",
            "extras_digest",
            "staging_key",
            "mode",
            "chain_hash",
            "cumulative_hash",
            "response_id",
            "admitted_at",
            "output_fingerprint",
            "continuation_fingerprint",
            "fingerprint_version",
        )
    }
    try:
        record = CallRecord(**columns)
        normalized = commit_row(
            record,
            staging_chain=row["staging_chain"],
            fingerprint=row["fingerprint"],
            context_len=row["context_len"],
            context_digest=row["context_digest"],
        )
    except StagingRecordError as error:
        field = _COLUMN_OF_RECORD_FIELD.get(error.field, error.field)
        raise StagingRecordError(_ROW, field, error.problem) from None
    if row["digest"] != record.cumulative_hash:
        raise StagingRecordError(_ROW, "digest", "must be the call's cumulative_hash")
    return normalized


def checked_failure_row(model_call_id: str, reason: str) -> dict[str, Any]:
    """The failure row of a call (its id checked by the store's id rule, the reason a
    non-empty string)."""
    return failure_row(check_model_call_id(model_call_id), reason)


def ledger_line(row: Mapping[str, Any]) -> bytes:
    """A row as NeMo Gym's FileLineageStore writes it: sorted keys, compact, ASCII (no newline)."""
    return json.dumps(row, sort_keys=True, separators=(",", ":")).encode()


# -- staged calls -----------------------------------------------------------------------


def checked_attachments(value: object) -> dict[str, dict[str, Any]] | None:
    """Attachments as staged: null, or {name: {"bytes": base64} | {"json": value}}.

    StagingRecordError naming the attachment otherwise (bytes must be standard
    base64). The values are kept exactly as sent.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        kind = type(value).__name__
        raise StagingRecordError(_STAGE, "attachments", f"must be an object or null, got {kind}")
    checked: dict[str, dict[str, Any]] = {}
    for name, item in value.items():
        where = f"attachments.{name}"
        if not isinstance(name, str) or not name:
            raise StagingRecordError(_STAGE, "attachments", "names must be non-empty strings")
        if not isinstance(item, Mapping) or len(item) != 1 or not item.keys() <= {"bytes", "json"}:
            raise StagingRecordError(
                _STAGE, where, 'must be {"bytes": "<base64>"} or {"json": <value>}'
            )
        if "bytes" in item:
            encoded = item["bytes"]
            if not isinstance(encoded, str):
                raise StagingRecordError(_STAGE, where, "bytes must be a base64 string")
            try:
                binascii.a2b_base64(encoded, strict_mode=True)
            except (binascii.Error, ValueError) as error:
                raise StagingRecordError(_STAGE, where, f"bytes are not base64: {error}") from None
        else:
            problem = _inexact_json(item["json"])
            if problem is not None:
                raise StagingRecordError(_STAGE, where, f"json {problem}")
        checked[name] = dict(item)
    return checked


_INTEGER_LOW, _INTEGER_END = -(2**63), 2**64


def _inexact_json(value: Any) -> str | None:
    """Why a JSON attachment could not come back exactly, or None.

    docs/staging.md promises a `{"json"}` attachment back as sent: NaN,
    Infinity and 1e400 would come back null, integers outside [-2**63, 2**64)
    as floats (issue 29). Walked without recursion.
    """
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return f"holds {item!r}, which JSON cannot hold"
        if isinstance(item, int) and not isinstance(item, bool):
            if not _INTEGER_LOW <= item < _INTEGER_END:
                return "holds an integer outside [-2**63, 2**64), which is not kept exactly"
        elif isinstance(item, Mapping):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return None


# A record's columns are handed to orjson as numpy arrays (`to_json(native_columns=True)`):
# it writes them as the very bytes their lists give, without a Python float per value.
_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def _as_list(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _dumps_sorted(value: Any) -> bytes:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | _NUMPY)
    except TypeError:  # an integer beyond 64 bits in a JSON attachment: written exactly
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_as_list
        ).encode()


def base_json(record: StagedCallBaseSnapshot) -> bytes:
    """The call's base snapshot as JSON (no extras): what fetch and freeze answer."""
    return orjson.dumps(StagedCallBaseSnapshot.to_json(record, native_columns=True), option=_NUMPY)


def extras_json(record: StagedCallRecord, attachments: Mapping[str, Attachment] | None) -> bytes:
    """`{"attachments": ..., "extras": ...}`, sorted keys: the rest of what was staged."""
    return _dumps_sorted({"attachments": attachments, "extras": record.extras})


def file_line(record: StagedCallRecord, attachments: Mapping[str, Attachment] | None) -> bytes:
    """The file store's line, sorted keys: `{"attachments", "packed_columns", "record"}`.

    The token columns are kept packed at rest (docs/staging.md#storage):
    `packed_columns` is the standard base64 of their narrowest exact form,
    compressed (`_staged_packed`), and `record` is the call without them.
    Lines of 0.3.0 (`{"attachments", "record"}`, the columns as lists) and of
    0.4.0 (`"columns"`: the stage request's base64 `>u8`/`>f8` images) are
    read too.
    """
    data = record.to_json(native_columns=True)
    blob = pack_columns_blob(columns_of(data))
    rest = {name: value for name, value in data.items() if name not in COLUMN_NAMES}
    encoded = binascii.b2a_base64(blob, newline=False).decode("ascii")
    return _dumps_sorted({"attachments": attachments, PACKED_KEY: encoded, "record": rest})


# The key of a line whose columns are kept packed at rest (0.5.0 on): older versions
# do not know it and cannot read such a line (CHANGELOG).
PACKED_KEY = "packed_columns"
# A line's columns as stored: a 0.4.0 line's base64 images, or a newer line's decoded arrays.
_StoredColumns = dict[str, str] | tuple[Any, Any, Any] | None


def _corrupt(where: str, error: Exception) -> CaptureCorrupt:
    return CaptureCorrupt(f"{where}: unreadable staged call ({type(error).__name__}: {error})")


def _blob_arrays(encoded: object, *, decode: bool) -> tuple[Any, Any, Any] | None:
    """A line's packed columns as arrays (`decode`), else only checked to be a string."""
    if not isinstance(encoded, str):
        raise TypeError(f"{PACKED_KEY} must be a base64 string")
    if not decode:
        return None
    try:
        columns = unpack_columns_blob(binascii.a2b_base64(encoded, strict_mode=True))
    except binascii.Error as error:
        raise ValueError(f"{PACKED_KEY} is not base64: {error}") from None
    return columns.ids, columns.mask, columns.log_probs


def _read_line(
    line: bytes, where: str, *, decode: bool = True
) -> tuple[dict[str, Any], _StoredColumns, dict[str, Any] | None]:
    """(record, columns as stored or None, attachments) of a file store line.

    A newer line's packed columns are decoded into arrays (`decode=False`:
    left out, for a reader of ids, extras or attachments only).
    """
    record: Any = None
    try:
        data = loads_json(line)
        record, attachments = data["record"], data["attachments"]
        if not isinstance(record, dict) or not (
            attachments is None or isinstance(attachments, dict)
        ):
            raise TypeError("record must be an object, attachments an object or null")
        columns: _StoredColumns = data.get("columns")
        if columns is not None and not isinstance(columns, dict):
            raise TypeError("columns must be an object")
        if PACKED_KEY in data:
            if columns is not None:
                raise TypeError(f"a line holds both columns and {PACKED_KEY}")
            if any(name in record for name in COLUMN_NAMES):
                raise TypeError(f"a record holds a column beside {PACKED_KEY}")
            columns = _blob_arrays(data[PACKED_KEY], decode=decode)
    except (ValueError, TypeError, KeyError) as error:
        call_id = record.get("model_call_id") if isinstance(record, dict) else None
        raise _corrupt(where if call_id is None else f"{where}: call {call_id!r}", error) from None
    return record, columns, attachments


def _native(record: dict[str, Any], columns: dict[str, str], where: str) -> dict[str, Any]:
    """`record` with its packed columns decoded into native-endian arrays (orjson writes those)."""
    try:
        return unpack_columns(record, columns, native=True)
    except StagingRecordError as error:
        raise _corrupt(where, error) from None


def parse_file_line(
    line: bytes, where: str, *, columns: bool = True
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(record JSON, attachments) of a file store line; CaptureCorrupt naming `where`.

    Packed columns come back as native-endian arrays; with `columns=False`
    (a reader of ids, extras or attachments only) a packed record is
    returned without them.
    """
    record, packed, attachments = _read_line(line, where, decode=columns)
    if isinstance(packed, tuple):
        record = {**record, **dict(zip(COLUMN_NAMES, packed, strict=True))}
    elif packed is not None and columns:
        record = _native(record, packed, where)
    return record, attachments


def parse_staged_call(line: bytes, where: str) -> ParsedStagedCall:
    """A file store line as the freeze hands it on: record, extras, columns as stored."""
    record, packed, _ = _read_line(line, where)
    extras = record.pop("extras", None)
    if isinstance(packed, tuple):
        return ParsedStagedCall(record, extras, arrays=packed)
    # The images are decoded (and checked) by whoever reads the call: the finalizer,
    # or `ParsedStagedCall.base()` for a plain answer; not twice.
    return ParsedStagedCall(record, extras, packed)


def base_json_of(record: Mapping[str, Any]) -> bytes:
    """A parsed base snapshot (columns as lists or arrays) as its JSON."""
    return orjson.dumps(record, option=_NUMPY)


def same_staged_line(stored: bytes, line: bytes, where: str) -> bool:
    """Whether two lines hold the same call and attachments, whichever form each is in.

    A call staged before the columns were stored packed, staged again after
    it, is an identical replay, not a conflict.
    """
    if stored == line:
        return True
    (old, old_attachments), (new, new_attachments) = (
        parse_file_line(stored, where),
        parse_file_line(line, where),
    )
    return old_attachments == new_attachments and _dumps_sorted(old) == _dumps_sorted(new)


def staged_ancestors(
    parent_call_id: str, lookup: Callable[[str], StagedCallBaseSnapshot | None], limit: int
) -> list[StagedCallBaseSnapshot]:
    """The staged calls from the root down to `parent_call_id`, walking parent links.

    The walk stops at a call that is not staged (so the chain does not start at
    a root, which the custody check refuses), at a loop, or after `limit` calls.
    """
    chain: list[StagedCallBaseSnapshot] = []
    seen: set[str] = set()
    cursor: str | None = parent_call_id
    while cursor is not None and cursor not in seen and len(chain) < limit:
        snapshot = lookup(cursor)
        if snapshot is None:
            break
        seen.add(cursor)
        chain.append(snapshot)
        cursor = snapshot.parent_call_id
    chain.reverse()
    return chain


# -- the freeze and the report ----------------------------------------------------------


def staged_lines(
    manifest: RolloutManifest, base_of: Callable[[str], StagedSnapshotLine | None]
) -> StagedLines:
    """The freeze of a staging rollout: per manifest record, its staged base JSON or None."""
    return StagedLines(
        manifest=manifest,
        snapshots=tuple(base_of(record.model_call_id) for record in manifest.records),
    )


def staged_capture(lines: StagedLines, rollout_id: str) -> StagedCapture:
    """The parsed freeze; CaptureCorrupt when a stored snapshot cannot be read back.

    Parsed records (the file store's) bring their extras along: the capture
    then carries every staged call's extras for the extras check.
    """
    snapshots: list[StagedCallBaseSnapshot | None] = []
    extras: dict[str, dict[str, Any] | None] | None = {}
    for record, line in zip(lines.manifest.records, lines.snapshots, strict=True):
        if line is None:
            snapshots.append(None)
            continue
        try:
            if isinstance(line, ParsedStagedCall):
                base = line.base()
                if extras is not None:
                    extras[record.model_call_id] = line.extras
            else:
                base, extras = loads_json(line), None
            snapshots.append(stored_snapshot(base))
        except (ValueError, TypeError) as error:
            raise CaptureCorrupt(
                f"staged call {record.model_call_id} of rollout {rollout_id} "
                f"cannot be read: {error}"
            ) from None
    return StagedCapture(manifest=lines.manifest, snapshots=tuple(snapshots), extras=extras)


def staging_report(
    rows: Iterable[Mapping[str, Any]], staged_ids: Iterable[str], cleared: int = 0
) -> StagingReport:
    """What `store inspect` shows of a staging rollout's rows, staged and cleared calls."""
    records: list[str] = []
    failures: list[tuple[str, str]] = []
    count = 0
    for row in rows:
        count += 1
        call_id = str(row.get("model_call_id"))
        if row.get("failure_reason") is not None:
            failures.append((call_id, str(row["failure_reason"])))
        elif row.get("staging_key") is not None:
            records.append(call_id)
    staged = list(staged_ids)
    committed = set(records)
    return StagingReport(
        ledger_rows=count,
        records=tuple(records),
        failures=tuple(failures),
        staged=len(staged),
        orphans=tuple(call for call in staged if call not in committed),
        cleared=cleared,
    )
