"""The build: what finalizing one record produced, as one typed, immutable value.

A build is made by exactly one named constructor per case, and decides its
mask reason where the decision is made. It becomes the seed's JSON object
(`to_dict`) only at the edges: the delivery functions, the HTTP answer and
the batch output. See docs/records-and-builds.md#build.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from token_finalizer.core.entries import Snapshot
from token_finalizer.core.staged_outcome import StagedOutcome

__all__ = [
    "MASK_SAMPLE_KEY",
    "STAGED_BUILDER",
    "Build",
    "BuildFailed",
    "BuildKind",
    "MaskReason",
    "SnapshotRef",
]

MASK_SAMPLE_KEY = "mask_sample"
CAPTURE_SNAPSHOT_KEY = "_capture_snapshot"
REDUNDANT_CAPTURE_KEY = "_redundant_capture"
#: The `builder` of a build made from an externally staged rollout (docs/staging.md).
STAGED_BUILDER = "staged"


class MaskReason(StrEnum):
    """Machine-readable reasons a build is masked; docs/records-and-builds.md#mask-reasons.

    Low-cardinality by design: metrics labels and the mask-fraction guard count
    them, so a value never changes. A reason is decided where the build fails
    or is judged, never read back from an error text (texts are for people).
    JSON forms and metric labels carry the plain string (`str(reason)`).
    """

    # The record itself
    MALFORMED_ROLLOUT_ID = "malformed_rollout_id"
    NO_CAPTURE_KEY = "no_capture_key"
    FINALIZE_ERROR = "finalize_error"
    # The store
    FREEZE_FAILED = "freeze_failed"
    STORE_UNREACHABLE = "store_unreachable"
    CAPTURE_INCOMPLETE = "capture_incomplete"
    EMPTY_CAPTURE = "empty_capture"
    # The builder
    NO_TRAINABLE_CHAIN = "no_trainable_chain"
    NO_TRAINABLE_TOKENS = "no_trainable_tokens"
    NOT_PREFIX_CONTIGUOUS = "not_prefix_contiguous"
    INVALID_TOKENS = "invalid_token_ids"
    DUPLICATE_CALL_ID = "duplicate_call_id"
    BUILD_FAILED = "build_failed"
    # Chain rules
    TERMINAL_BROKEN = "terminal_chain_broken"
    TERMINAL_NOT_CAPTURED = "terminal_not_captured"
    DECLARED_TERMINAL_UNMATCHED = "declared_terminal_unmatched"
    UNRESOLVED_RETRIES = "unresolved_retries"
    UNRESOLVED_PARENTS = "unresolved_parent_calls"
    MULTIPLE_ROOTS = "multiple_roots"
    MULTIPLE_CHAINS = "multiple_chains"
    # The record arrived marked mask_sample by its harness
    RECORD_MASKED = "record_masked"
    # External staging (docs/staging.md#mask-reasons): a staged rollout is masked with
    # the reference verifier's own error code, or one of our staging checks' codes.
    STAGED_RECORD_MISSING = "staged_record_missing"
    ROLLOUT_FAILED = "rollout_failed"
    CAPTURE_POISONED = "capture_poisoned"
    EMPTY_MANIFEST = "empty_manifest"
    UNSUPPORTED_SCHEMA = "unsupported_schema"
    UNSUPPORTED_DIGEST = "unsupported_digest"
    UNSUPPORTED_EXTRAS_DIGEST = "unsupported_extras_digest"
    DUPLICATE_MANIFEST_ROW = "duplicate_manifest_row"
    DUPLICATE_STAGING_KEY = "duplicate_staging_key"
    ROW_COUNT_MISMATCH = "row_count_mismatch"
    DUPLICATE_SNAPSHOT = "duplicate_snapshot"
    SNAPSHOT_IDENTITY_MISMATCH = "snapshot_identity_mismatch"
    SNAPSHOT_ORDER_MISMATCH = "snapshot_order_mismatch"
    WRONG_ROLLOUT = "wrong_rollout"
    WRONG_MODEL_CALL_ID = "wrong_model_call_id"
    WRONG_PARENT_CALL_ID = "wrong_parent_call_id"
    WRONG_MODE = "wrong_mode"
    WRONG_PREV_LEN = "wrong_prev_len"
    WRONG_DELTA_LEN = "wrong_delta_len"
    WRONG_CUM_LEN = "wrong_cum_len"
    WRONG_WEIGHT_VERSION = "wrong_weight_version"
    WRONG_DIGEST = "wrong_digest"
    WRONG_EXTRAS_DIGEST = "wrong_extras_digest"
    WRONG_CHAIN_HASH = "wrong_chain_hash"
    WRONG_CUMULATIVE_HASH = "wrong_cumulative_hash"
    WRONG_SCHEMA_VERSION = "wrong_schema_version"
    WRONG_DIGEST_VERSION = "wrong_digest_version"
    WRONG_EXTRAS_DIGEST_VERSION = "wrong_extras_digest_version"
    INVALID_SNAPSHOT = "invalid_snapshot"
    CORRUPT_DIGEST = "corrupt_digest"
    MISSING_PARENT = "missing_parent"
    PARENT_LENGTH_MISMATCH = "parent_length_mismatch"
    LINEAGE_CYCLE = "lineage_cycle"
    MISSING_TERMINAL = "missing_terminal"
    CHAIN_HASH_MISMATCH = "chain_hash_mismatch"
    INVALID_MASK_ORDER = "invalid_mask_order"
    EMPTY_GENERATION = "empty_generation"
    EMPTY_TRAINING_ROW = "empty_training_row"
    CUMULATIVE_HASH_MISMATCH = "cumulative_hash_mismatch"
    MISSING_EXTRAS = "missing_extras"
    INVALID_EXTRAS = "invalid_extras"
    EXTRAS_DIGEST_MISMATCH = "extras_digest_mismatch"


class BuildFailed(Exception):
    """The capture cannot yield a trainable chain: the message is the build's error.

    `reason` is the mask reason, chosen where the failure is found; the
    message may be reworded freely without changing what metrics and the
    guard count, except where it is NeMo Gym's own error string, which stays
    byte for byte Gym's (docs/records-and-builds.md#error-strings). `hint`
    is our guidance beside it (the build's and the record's `hint`), never
    appended to the error.
    """

    def __init__(self, message: str, *, reason: MaskReason, hint: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.hint = hint


@dataclass(frozen=True, slots=True)
class SnapshotRef:
    """The exact frozen snapshot a build consumed: what a retire must name."""

    snapshot_id: str
    version: int

    @classmethod
    def of(cls, snapshot: Snapshot) -> SnapshotRef:
        return cls(snapshot_id=snapshot.snapshot_id, version=snapshot.version)

    def to_dict(self) -> dict[str, Any]:
        return {"snapshot_id": self.snapshot_id, "version": self.version}


class BuildKind(StrEnum):
    """Which case produced a build."""

    BUILT = "built"  # a rebuilt response (masked or not)
    FAILED = "failed"  # the freeze, the builder or the projection failed
    UNUSABLE = "unusable"  # the record itself cannot be finalized (no or malformed id)
    REDUNDANT = "redundant_capture"  # the record already carried its tokens
    STAGED = "staged"  # an externally staged rollout, verified (masked or not)


@dataclass(frozen=True, slots=True)
class Build:
    """One finalize result. Use the constructors; never build one field by field."""

    kind: BuildKind
    mask_sample: bool
    metrics: Mapping[str, Any]
    rollout_id: str | None = None
    builder: str | None = None
    rebuilt_response: dict[str, Any] | None = None
    mask_reason: MaskReason | None = None
    error: str | None = None
    # Our guidance on what to do about `error` (docs/records-and-builds.md#hints):
    # kept apart, so that an error NeMo Gym defines stays exactly Gym's text.
    hint: str | None = None
    unresolved_retries: tuple[str, ...] = ()
    unresolved_parent_calls: tuple[str, ...] = ()
    snapshot: SnapshotRef | None = None
    staged: StagedOutcome | None = None

    @classmethod
    def built(
        cls,
        snapshot: Snapshot,
        *,
        builder: str,
        response: dict[str, Any],
        metrics: Mapping[str, Any],
        mask_reason: MaskReason | None,
        unresolved_retries: Sequence[str] = (),
        unresolved_parent_calls: Sequence[str] = (),
    ) -> Build:
        """A rebuilt response; masked exactly when `mask_reason` is set."""
        return cls(
            kind=BuildKind.BUILT,
            rollout_id=snapshot.rollout_id,
            builder=builder,
            rebuilt_response=response,
            metrics=metrics,
            mask_sample=mask_reason is not None,
            mask_reason=mask_reason,
            unresolved_retries=tuple(unresolved_retries),
            unresolved_parent_calls=tuple(unresolved_parent_calls),
            snapshot=SnapshotRef.of(snapshot),
        )

    @classmethod
    def failed(
        cls,
        rollout_id: str,
        error: str,
        *,
        mask_reason: MaskReason,
        metrics: Mapping[str, Any],
        builder: str | None = None,
        snapshot: Snapshot | None = None,
        hint: str | None = None,
    ) -> Build:
        """No rebuilt response: always masked; `snapshot` when the freeze had succeeded."""
        return cls(
            kind=BuildKind.FAILED,
            rollout_id=rollout_id,
            builder=builder,
            metrics=metrics,
            mask_sample=True,
            mask_reason=mask_reason,
            error=error,
            hint=hint,
            snapshot=None if snapshot is None else SnapshotRef.of(snapshot),
        )

    @classmethod
    def staged_rollout(
        cls,
        snapshot: Snapshot,
        outcome: StagedOutcome,
        *,
        metrics: Mapping[str, Any],
        mask_reason: MaskReason | None,
    ) -> Build:
        """A staged rollout's verdict; masked exactly when `mask_reason` is set.

        The record is never rebuilt (NeMo Gym's external staging requires
        `rebuild_response: false`): the verified row is `outcome.row`.
        """
        return cls(
            kind=BuildKind.STAGED,
            rollout_id=snapshot.rollout_id,
            builder=STAGED_BUILDER,
            metrics=metrics,
            mask_sample=mask_reason is not None,
            mask_reason=mask_reason,
            error=None if outcome.error is None else str(outcome.error),
            snapshot=SnapshotRef.of(snapshot),
            staged=outcome,
        )

    @classmethod
    def unusable(cls, error: str, *, mask_reason: MaskReason) -> Build:
        """A record that needed tokens and cannot get them; nothing was consumed."""
        return cls(
            kind=BuildKind.UNUSABLE,
            # The record's `_ng_token_capture` is exactly this dict (the seed's shape).
            metrics={"n_calls": 0, "error": error, "mask_reason": str(mask_reason)},
            mask_sample=True,
            mask_reason=mask_reason,
            error=error,
        )

    @classmethod
    def redundant_capture(cls, snapshot: Snapshot) -> Build:
        """A record that carries its own tokens; its frozen capture may be retired."""
        return cls(
            kind=BuildKind.REDUNDANT,
            metrics={},
            mask_sample=False,
            snapshot=SnapshotRef.of(snapshot),
        )

    @property
    def retirable(self) -> bool:
        """Whether retiring this build's snapshot is allowed (never for a masked build)."""
        if self.mask_sample or self.snapshot is None:
            return False
        if self.kind is BuildKind.STAGED:
            return self.staged is not None and self.staged.row is not None
        return self.kind in (BuildKind.BUILT, BuildKind.REDUNDANT)

    @property
    def token_count(self) -> int:
        """Token ids in the rebuilt output or the staged row: a cheap size estimate of an answer."""
        if self.staged is not None and self.staged.row is not None:
            return len(self.staged.row.token_ids)
        if self.rebuilt_response is None:
            return 0
        count = 0
        for item in self.rebuilt_response.get("output") or ():
            if isinstance(item, dict):
                count += sum(v.size for v in item.values() if isinstance(v, np.ndarray))
        return count

    def record_capture(self) -> dict[str, Any]:
        """What the record's `_ng_token_capture` receives: the metrics, plus error and hint."""
        capture = dict(self.metrics)
        if self.error:
            capture["error"] = self.error
        if self.hint:
            capture["hint"] = self.hint
        if self.mask_reason is not None:
            capture["mask_reason"] = str(self.mask_reason)
        return capture

    def to_dict(self, *, with_response: bool = True) -> dict[str, Any]:
        """The seed's JSON object for this build (token arrays left as they are).

        `with_response=False` leaves out `rebuilt_response`: the finalize answer
        carries the rebuilt output once, in its record (docs/finalizer-api.md).
        A staged build adds `staged` (its token columns as plain lists) with
        the response only: the finalize answer carries it beside the build.
        """
        if self.kind is BuildKind.REDUNDANT:
            assert self.snapshot is not None
            redundant: dict[str, Any] = {"rebuilt_response": None} if with_response else {}
            return {
                **redundant,
                MASK_SAMPLE_KEY: False,
                REDUNDANT_CAPTURE_KEY: True,
                CAPTURE_SNAPSHOT_KEY: self.snapshot.to_dict(),
            }
        data: dict[str, Any] = {}
        if self.rollout_id is not None:
            data["rollout_id"] = self.rollout_id
        if self.builder is not None:
            data["builder"] = self.builder
        if with_response:
            data["rebuilt_response"] = self.rebuilt_response
        data["metrics"] = dict(self.metrics)
        data[MASK_SAMPLE_KEY] = self.mask_sample
        if self.mask_reason is not None:
            data["mask_reason"] = str(self.mask_reason)
        if self.error is not None:
            data["error"] = self.error
        if self.hint is not None:
            data["hint"] = self.hint
        if self.kind is BuildKind.BUILT:
            data["unresolved_retries"] = list(self.unresolved_retries)
            data["unresolved_parent_calls"] = list(self.unresolved_parent_calls)
        if self.snapshot is not None:
            data[CAPTURE_SNAPSHOT_KEY] = self.snapshot.to_dict()
        if with_response and self.staged is not None:
            data["staged"] = self.staged.to_json(form="lists")
        return data
