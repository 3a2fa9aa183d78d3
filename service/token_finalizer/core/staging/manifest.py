"""The ledger's token-free view of a rollout: rows, failures, receipts (docs/staging.md#types).

``CallRecord`` is one committed call (what the ledger knows of a staged call,
plus the served response id and content fingerprints); ``ManifestFailure`` is
a call whose capture did not complete; ``RolloutManifest`` is both lists in
commit order; ``RolloutReceipt`` is the manifest the trainer verifies, with
the terminal call and how it was chosen. Validation equals NeMo Gym 0.7.0's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from token_finalizer.core.staging._wire import Fields
from token_finalizer.core.staging.digests import (
    EXTRAS_DIGEST_VERSION,
    STAGING_DIGEST_VERSION,
    STAGING_SCHEMA_VERSION,
)
from token_finalizer.core.staging.records import CAPTURE_MODES

__all__ = [
    "INVALID_COMMIT_COORDS_REASON",
    "LEDGER_ROW_MISSING_CHAIN_HASH_REASON",
    "LEDGER_ROW_MISSING_RESPONSE_ID_REASON",
    "TERMINAL_SELECTIONS",
    "UNCOMMITTED_CALL_REASON",
    "UNRESOLVED_PARENT_REASON",
    "WORKER_CAPTURE_FAILED_REASON",
    "WORKER_MISSING_COMMIT_COORDS_REASON",
    "CallRecord",
    "ManifestFailure",
    "RolloutManifest",
    "RolloutReceipt",
]

# Failure reasons a ledger row can carry (a wire contract: consumers switch on them).
UNRESOLVED_PARENT_REASON = "unresolved_parent"
UNCOMMITTED_CALL_REASON = "request_finished_without_staged_coordinates"
WORKER_MISSING_COMMIT_COORDS_REASON = "worker_response_missing_commit_coordinates"
WORKER_CAPTURE_FAILED_REASON = "worker_capture_failed"
INVALID_COMMIT_COORDS_REASON = "invalid_worker_commit_coordinates"
LEDGER_ROW_MISSING_RESPONSE_ID_REASON = "ledger_row_missing_response_id"
LEDGER_ROW_MISSING_CHAIN_HASH_REASON = "ledger_row_missing_chain_hash"

TERMINAL_SELECTIONS = ("declared", "response_id", "content", "heuristic")

_VERSION_FIELDS = ("schema_version", "digest_version", "extras_digest_version")
_VERSIONS = {
    "schema_version": STAGING_SCHEMA_VERSION,
    "digest_version": STAGING_DIGEST_VERSION,
    "extras_digest_version": EXTRAS_DIGEST_VERSION,
}


def _check_versions(instance: Any, fields: Fields, names: tuple[str, ...]) -> None:
    for name in names:
        value = fields.version(name, getattr(instance, name), _VERSIONS[name])
        object.__setattr__(instance, name, value)


_CALL_RECORD_FIELDS = (
    *_VERSION_FIELDS,
    "model_call_id",
    "parent_call_id",
    "prev_len",
    "delta_len",
    "cum_len",
    "weight_version",
    "digest",
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
_CALL_RECORD_REQUIRED = (
    "model_call_id",
    "prev_len",
    "delta_len",
    "cum_len",
    "weight_version",
    "digest",
    "extras_digest",
    "staging_key",
    "chain_hash",
    "cumulative_hash",
    "response_id",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class CallRecord:
    """One committed call of the manifest (token-free).

    ``digest`` is the staged call's staging digest; ``response_id`` the id of
    the response served for it; ``admitted_at`` the model server's admission
    time; the fingerprints (version ``fingerprint_version``, 0 = none) key the
    content witness of terminal attribution.
    """

    model_call_id: str
    parent_call_id: str | None = None
    prev_len: int
    delta_len: int
    cum_len: int
    weight_version: int
    digest: str
    extras_digest: str
    staging_key: str
    mode: str = "token_in"
    chain_hash: str
    cumulative_hash: str
    response_id: str
    admitted_at: float | None = None
    output_fingerprint: str | None = None
    continuation_fingerprint: str | None = None
    fingerprint_version: int = 0
    schema_version: int = STAGING_SCHEMA_VERSION
    digest_version: int = STAGING_DIGEST_VERSION
    extras_digest_version: int = EXTRAS_DIGEST_VERSION

    def __post_init__(self) -> None:
        fields = Fields("CallRecord")
        _check_versions(self, fields, _VERSION_FIELDS)
        fields.identifier("model_call_id", self.model_call_id)
        fields.optional_identifier("parent_call_id", self.parent_call_id)
        for name in ("prev_len", "delta_len", "cum_len", "weight_version"):
            fields.count(name, getattr(self, name))
        fields.digest("digest", self.digest)
        fields.digest("extras_digest", self.extras_digest)
        fields.identifier("staging_key", self.staging_key)
        fields.choice("mode", self.mode, CAPTURE_MODES)
        fields.digest("chain_hash", self.chain_hash)
        fields.digest("cumulative_hash", self.cumulative_hash)
        fields.identifier("response_id", self.response_id)
        object.__setattr__(
            self, "admitted_at", fields.optional_number("admitted_at", self.admitted_at)
        )
        fields.optional_digest("output_fingerprint", self.output_fingerprint)
        fields.optional_digest("continuation_fingerprint", self.continuation_fingerprint)
        fields.count("fingerprint_version", self.fingerprint_version)

        if self.delta_len == 0 or self.cum_len != self.prev_len + self.delta_len:
            raise fields.fail(
                "cum_len", "manifest lengths must describe a non-empty contiguous delta"
            )
        if self.parent_call_id is None and self.prev_len != 0:
            raise fields.fail("prev_len", "a parentless manifest row must have prev_len == 0")
        if self.parent_call_id is not None and self.prev_len == 0:
            raise fields.fail("prev_len", "a child manifest row must have prev_len > 0")
        if self.parent_call_id is None and self.mode != "text":
            raise fields.fail("mode", "a parentless manifest row must use text mode")
        if self.parent_call_id is not None and self.mode != "token_in":
            raise fields.fail("mode", "a child manifest row must use token_in mode")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CallRecord:
        """Read the wire form; any rule broken raises ``StagingRecordError``."""
        Fields("CallRecord").keys(data, _CALL_RECORD_FIELDS, _CALL_RECORD_REQUIRED)
        return cls(**data)

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _CALL_RECORD_FIELDS}


_FAILURE_FIELDS = ("schema_version", "model_call_id", "reason")


@dataclass(frozen=True, slots=True, kw_only=True)
class ManifestFailure:
    """A call whose capture did not complete, and why (one of the failure reasons)."""

    model_call_id: str
    reason: str
    schema_version: int = STAGING_SCHEMA_VERSION

    def __post_init__(self) -> None:
        fields = Fields("ManifestFailure")
        _check_versions(self, fields, ("schema_version",))
        fields.identifier("model_call_id", self.model_call_id)
        fields.identifier("reason", self.reason)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ManifestFailure:
        Fields("ManifestFailure").keys(data, _FAILURE_FIELDS, ("model_call_id", "reason"))
        return cls(**data)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "model_call_id": self.model_call_id,
            "reason": self.reason,
        }


def _read_items(fields: Fields, name: str, value: object, kind: Any) -> tuple[Any, ...]:
    """A list of ``kind`` instances or of their wire forms, as a tuple of instances."""

    def read(item: object) -> Any:
        if isinstance(item, kind):
            return item
        if isinstance(item, Mapping):
            return kind.from_json(item)
        raise fields.fail(name, f"items must be objects, got {type(item).__name__}")

    return fields.items(name, value, read)


_MANIFEST_FIELDS = ("schema_version", "rollout_id", "records", "failures")


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutManifest:
    """A rollout's committed calls and failures, each list in commit order."""

    rollout_id: str
    records: tuple[CallRecord, ...] = ()
    failures: tuple[ManifestFailure, ...] = ()
    schema_version: int = STAGING_SCHEMA_VERSION

    def __post_init__(self) -> None:
        fields = Fields("RolloutManifest")
        _check_versions(self, fields, ("schema_version",))
        fields.identifier("rollout_id", self.rollout_id)
        object.__setattr__(
            self, "records", _read_items(fields, "records", self.records, CallRecord)
        )
        object.__setattr__(
            self, "failures", _read_items(fields, "failures", self.failures, ManifestFailure)
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RolloutManifest:
        Fields("RolloutManifest").keys(data, _MANIFEST_FIELDS, ("rollout_id",))
        return cls(**data)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "rollout_id": self.rollout_id,
            "records": [record.to_json() for record in self.records],
            "failures": [failure.to_json() for failure in self.failures],
        }


_RECEIPT_FIELDS = (
    *_VERSION_FIELDS,
    "rollout_id",
    "reward",
    "terminal_model_call_id",
    "manifest",
    "capture_poisoned",
    "failure_reason",
    "terminal_selection",
    "terminal_attribution_reason",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutReceipt:
    """The immutable manifest a trainer verifies, with its terminal call.

    States: unpoisoned (terminal and selection set, no failure reason);
    poisoned with a failure reason (terminal and selection optional); a null
    selection means no attribution ran, so no terminal and a failure reason.
    """

    rollout_id: str
    reward: float | None = None
    terminal_model_call_id: str | None = None
    manifest: tuple[CallRecord, ...] = field(default=())
    capture_poisoned: bool = False
    failure_reason: str | None = None
    terminal_selection: str | None = None
    terminal_attribution_reason: str | None = None
    schema_version: int = STAGING_SCHEMA_VERSION
    digest_version: int = STAGING_DIGEST_VERSION
    extras_digest_version: int = EXTRAS_DIGEST_VERSION

    def __post_init__(self) -> None:
        fields = Fields("RolloutReceipt")
        _check_versions(self, fields, _VERSION_FIELDS)
        fields.identifier("rollout_id", self.rollout_id)
        object.__setattr__(self, "reward", fields.optional_number("reward", self.reward))
        fields.optional_identifier("terminal_model_call_id", self.terminal_model_call_id)
        manifest = _read_items(fields, "manifest", self.manifest, CallRecord)
        object.__setattr__(self, "manifest", manifest)
        fields.boolean("capture_poisoned", self.capture_poisoned)
        fields.text("failure_reason", self.failure_reason)
        if self.terminal_selection is not None:
            fields.choice("terminal_selection", self.terminal_selection, TERMINAL_SELECTIONS)
        fields.text("terminal_attribution_reason", self.terminal_attribution_reason)

        call_ids = [record.model_call_id for record in manifest]
        if len(call_ids) != len(set(call_ids)):
            raise fields.fail("manifest", "contains duplicate model_call_id values")
        terminal = self.terminal_model_call_id
        if terminal is not None and terminal not in call_ids:
            raise fields.fail("terminal_model_call_id", "is absent from the receipt manifest")
        if not self.capture_poisoned:
            if self.failure_reason is not None:
                raise fields.fail(
                    "failure_reason", "an unpoisoned receipt cannot carry a failure_reason"
                )
            if terminal is None or self.terminal_selection is None:
                raise fields.fail(
                    "terminal_model_call_id",
                    "an unpoisoned receipt must name terminal_model_call_id and terminal_selection",
                )
        if self.terminal_selection is None:
            if terminal is not None:
                raise fields.fail(
                    "terminal_selection", "terminal_model_call_id requires a terminal_selection"
                )
            if self.failure_reason is None:
                raise fields.fail(
                    "failure_reason",
                    "a receipt with no attribution stage must be poisoned with a failure_reason",
                )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RolloutReceipt:
        """Read the wire form; any rule broken raises ``StagingRecordError``."""
        Fields("RolloutReceipt").keys(data, _RECEIPT_FIELDS, ("rollout_id",))
        return cls(**data)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "digest_version": self.digest_version,
            "extras_digest_version": self.extras_digest_version,
            "rollout_id": self.rollout_id,
            "reward": self.reward,
            "terminal_model_call_id": self.terminal_model_call_id,
            "manifest": [record.to_json() for record in self.manifest],
            "capture_poisoned": self.capture_poisoned,
            "failure_reason": self.failure_reason,
            "terminal_selection": self.terminal_selection,
            "terminal_attribution_reason": self.terminal_attribution_reason,
        }
