"""The `http` source's reading of external staging answers (docs/staging.md#protocol).

A store server freezes a staging rollout into `{"kind": "staged", "manifest",
"snapshots", ...}` (each snapshot's token columns packed when the source
asks, docs/staging.md#packed-columns) and answers `staged/extras` with `{"extras", "missing"}`;
these functions turn the parsed bodies into the finalizer's types, so a
remote store is used exactly like a local one. Anything that does not fit
is the store's fault: SourceUnavailable naming what is wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from token_finalizer.core.entries import Snapshot
from token_finalizer.core.errors import SourceUnavailable
from token_finalizer.core.staging import (
    RolloutManifest,
    StagedCallBaseSnapshot,
    StagedCapture,
    StagingRecordError,
    stored_snapshot,
    unpack_columns,
)
from token_finalizer.sources.base import StagedExtras

__all__ = ["STAGED_KIND", "extras_of", "staged_snapshot"]

STAGED_KIND = "staged"
# A packed snapshot's keys, and the extras a store may send along with it.
_PACKED_KEYS = frozenset({"record", "columns"})
_EXTRAS = "extras"


def staged_snapshot(
    body: dict[str, Any], rollout_id: str, snapshot_id: str, version: int, where: str
) -> Snapshot:
    """The Snapshot of a staging rollout's freeze answer (`where` names it in errors)."""
    listed_manifest = body.get("manifest")
    if not isinstance(listed_manifest, dict):
        raise SourceUnavailable(f"{where} has no manifest object")
    try:
        manifest = RolloutManifest.from_json(listed_manifest)
    except StagingRecordError as error:
        raise SourceUnavailable(f"{where} has an invalid manifest: {error}") from None
    if manifest.rollout_id != rollout_id:
        raise SourceUnavailable(f"{where} holds the manifest of rollout {manifest.rollout_id}")
    listed = body.get("snapshots")
    if not isinstance(listed, list) or len(listed) != len(manifest.records):
        raise SourceUnavailable(f"{where} does not list one snapshot (or null) per manifest record")
    snapshots: list[StagedCallBaseSnapshot | None] = []
    # Every staged call's extras, when each packed snapshot carried them.
    extras: dict[str, dict[str, Any] | None] | None = {}
    for record, item in zip(manifest.records, listed, strict=True):
        if item is None:
            snapshots.append(None)
            continue
        try:
            if extras is not None and isinstance(item, dict) and _EXTRAS in item:
                extras[record.model_call_id] = _extras(item[_EXTRAS], record.model_call_id, where)
            else:
                extras = None
            snapshots.append(stored_snapshot(_unpacked(item)))
        except StagingRecordError as error:
            raise SourceUnavailable(
                f"{where}: the snapshot of call {record.model_call_id} is invalid: {error}"
            ) from None
    if body.get("entries") != [] or body.get("incomplete") is not False:
        raise SourceUnavailable(f"{where} is staged but lists entries or an incomplete capture")
    return Snapshot(
        rollout_id=rollout_id,
        entries=(),
        incomplete=False,
        snapshot_id=snapshot_id,
        version=version,
        staged=StagedCapture(manifest=manifest, snapshots=tuple(snapshots), extras=extras),
    )


def _unpacked(item: Any) -> Any:
    """A snapshot as the store sent it: packed (`{"record", "columns"[, "extras"]}`) or plain."""
    if isinstance(item, dict) and _PACKED_KEYS <= item.keys() <= {*_PACKED_KEYS, _EXTRAS}:
        return unpack_columns(item["record"], item["columns"])
    return item


def _extras(value: object, call_id: str, where: str) -> dict[str, Any] | None:
    if value is not None and not isinstance(value, dict):
        raise SourceUnavailable(f"{where}: the extras of call {call_id} are not an object")
    return value


def extras_of(body: object, call_ids: Sequence[str], where: str) -> StagedExtras:
    """The extras of the staged calls among `call_ids`, from a `staged/extras` answer."""
    extras = body.get("extras") if isinstance(body, dict) else None
    missing = body.get("missing") if isinstance(body, dict) else None
    if not isinstance(extras, list) or len(extras) != len(call_ids):
        raise SourceUnavailable(f"{where} does not list one extras value per call asked")
    if not isinstance(missing, list) or not all(
        isinstance(call_id, str) and call_id in call_ids for call_id in missing
    ):
        raise SourceUnavailable(f"{where} lists as missing calls that were not asked for")
    found: StagedExtras = {}
    for call_id, value in zip(call_ids, extras, strict=True):
        if call_id in missing:
            continue
        found[call_id] = _extras(value, call_id, where)
    return found
