"""A staging rollout as a store hands it to the finalizer (docs/staging.md#storage).

A store that holds a rollout's ledger rows and staged calls answers a freeze
with ``StagedCapture``: the manifest of its ledger, and per manifest record,
in manifest order, the staged call's base snapshot (``None`` when the call
was never staged). ``stored_snapshot`` reads a base snapshot back from its
stored JSON with every field typed but its invariants and digest left
unchecked: a store wrote it after full validation, and verification
recomputes the digest anyway, so a record damaged at rest is reported with
the verifier's own code (``corrupt_digest``, ``invalid_snapshot``) rather
than hidden behind a read error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from token_finalizer.core.staging._wire import Fields, StagingRecordError
from token_finalizer.core.staging.digests import (
    EMPTY_EXTRAS_DIGEST,
    EXTRAS_DIGEST_VERSION,
    STAGING_DIGEST_VERSION,
    STAGING_SCHEMA_VERSION,
)
from token_finalizer.core.staging.manifest import RolloutManifest
from token_finalizer.core.staging.records import (
    SNAPSHOT_FIELDS,
    SNAPSHOT_REQUIRED,
    StagedCallBaseSnapshot,
)

__all__ = ["StagedCapture", "stored_snapshot"]

_COUNTS = ("prev_len", "delta_len", "cum_len", "weight_version")
_DIGESTS = ("digest", "extras_digest", "chain_hash", "cumulative_hash")


@dataclass(frozen=True, slots=True)
class StagedCapture:
    """A frozen staging rollout: its manifest, and the staged base snapshot of each record.

    ``snapshots[i]`` belongs to ``manifest.records[i]`` (matched by model call
    id within the rollout); ``None`` where the store holds no staged call for
    that record. ``extras``: every staged call's extras by model call id, when
    the freeze carried them (docs/staging.md#packed-columns); None when they
    must be read apart.
    """

    manifest: RolloutManifest
    snapshots: tuple[StagedCallBaseSnapshot | None, ...]
    extras: Mapping[str, dict[str, Any] | None] | None = None

    def __post_init__(self) -> None:
        if len(self.snapshots) != len(self.manifest.records):
            raise ValueError(
                f"{len(self.snapshots)} snapshots for {len(self.manifest.records)} manifest records"
            )

    @property
    def missing_call_ids(self) -> tuple[str, ...]:
        """The manifest records whose staged call the store does not hold, in manifest order."""
        return tuple(
            record.model_call_id
            for record, snapshot in zip(self.manifest.records, self.snapshots, strict=True)
            if snapshot is None
        )


def stored_snapshot(data: Mapping[str, Any]) -> StagedCallBaseSnapshot:
    """A base snapshot read back from a store: every field typed, nothing else re-checked.

    Unknown keys (``extras`` included) are refused, as are values of the wrong
    JSON type, with ``StagingRecordError``. The staging digest, the lengths and
    the mask rules are not checked here: ``verify_and_linearize`` checks them
    and names what is wrong with its own codes.
    """
    fields = Fields("StagedCallBaseSnapshot")
    fields.keys(data, SNAPSHOT_FIELDS, SNAPSHOT_REQUIRED)
    snapshot = object.__new__(StagedCallBaseSnapshot)

    def put(name: str, value: object) -> None:
        object.__setattr__(snapshot, name, value)

    versions = (
        ("schema_version", STAGING_SCHEMA_VERSION),
        ("digest_version", STAGING_DIGEST_VERSION),
        ("extras_digest_version", EXTRAS_DIGEST_VERSION),
    )
    for name, default in versions:
        put(name, _version(fields, name, data.get(name, default)))
    put("rollout_id", fields.identifier("rollout_id", data["rollout_id"]))
    put("model_call_id", fields.identifier("model_call_id", data["model_call_id"]))
    put("parent_call_id", fields.optional_identifier("parent_call_id", data.get("parent_call_id")))
    put("mode", fields.identifier("mode", data["mode"]))
    for name in _COUNTS:
        put(name, fields.count(name, data[name]))
    for name in _DIGESTS:
        value = data.get(name, EMPTY_EXTRAS_DIGEST if name == "extras_digest" else None)
        if type(value) is not str:
            raise fields.fail(name, f"must be a string, got {type(value).__name__}")
        put(name, value)
    put("token_ids_delta", fields.token_ids("token_ids_delta", data["token_ids_delta"]))
    put("token_mask_delta", fields.floats("token_mask_delta", data["token_mask_delta"]))
    put(
        "generation_log_probs_delta",
        fields.floats("generation_log_probs_delta", data["generation_log_probs_delta"]),
    )
    return snapshot


def _version(fields: Fields, name: str, value: object) -> int:
    # The value is kept as stored (a wrong one is the verifier's `wrong_<name>`);
    # only its type is checked.
    if type(value) is not int:
        raise StagingRecordError(fields.type_name, name, f"must be an integer, got {value!r}")
    return value
