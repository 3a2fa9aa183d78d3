"""The typed build: mask reasons are fixed codes, and JSON forms carry them as plain strings."""

from __future__ import annotations

from enum import StrEnum

from tests.support.captures import make_entry, snapshot_of
from token_finalizer.core.build import Build, MaskReason
from token_finalizer.core.rebuild import rebuild_snapshot

# The published codes (docs/records-and-builds.md#mask-reasons): metric labels
# and guard counts, so neither a name nor a value may change.
_PUBLISHED = {
    "MALFORMED_ROLLOUT_ID": "malformed_rollout_id",
    "NO_CAPTURE_KEY": "no_capture_key",
    "FINALIZE_ERROR": "finalize_error",
    "FREEZE_FAILED": "freeze_failed",
    "STORE_UNREACHABLE": "store_unreachable",
    "CAPTURE_INCOMPLETE": "capture_incomplete",
    "EMPTY_CAPTURE": "empty_capture",
    "NO_TRAINABLE_CHAIN": "no_trainable_chain",
    "NO_TRAINABLE_TOKENS": "no_trainable_tokens",
    "NOT_PREFIX_CONTIGUOUS": "not_prefix_contiguous",
    "INVALID_TOKENS": "invalid_token_ids",
    "DUPLICATE_CALL_ID": "duplicate_call_id",
    "BUILD_FAILED": "build_failed",
    "TERMINAL_BROKEN": "terminal_chain_broken",
    "TERMINAL_NOT_CAPTURED": "terminal_not_captured",
    "DECLARED_TERMINAL_UNMATCHED": "declared_terminal_unmatched",
    "UNRESOLVED_RETRIES": "unresolved_retries",
    "UNRESOLVED_PARENTS": "unresolved_parent_calls",
    "MULTIPLE_ROOTS": "multiple_roots",
    "MULTIPLE_CHAINS": "multiple_chains",
    "RECORD_MASKED": "record_masked",
    # External staging: the reference verifier's codes and our staging checks' codes.
    "STAGED_RECORD_MISSING": "staged_record_missing",
    "ROLLOUT_FAILED": "rollout_failed",
    "CAPTURE_POISONED": "capture_poisoned",
    "EMPTY_MANIFEST": "empty_manifest",
    "UNSUPPORTED_SCHEMA": "unsupported_schema",
    "UNSUPPORTED_DIGEST": "unsupported_digest",
    "UNSUPPORTED_EXTRAS_DIGEST": "unsupported_extras_digest",
    "DUPLICATE_MANIFEST_ROW": "duplicate_manifest_row",
    "DUPLICATE_STAGING_KEY": "duplicate_staging_key",
    "ROW_COUNT_MISMATCH": "row_count_mismatch",
    "DUPLICATE_SNAPSHOT": "duplicate_snapshot",
    "SNAPSHOT_IDENTITY_MISMATCH": "snapshot_identity_mismatch",
    "SNAPSHOT_ORDER_MISMATCH": "snapshot_order_mismatch",
    "WRONG_ROLLOUT": "wrong_rollout",
    "WRONG_MODEL_CALL_ID": "wrong_model_call_id",
    "WRONG_PARENT_CALL_ID": "wrong_parent_call_id",
    "WRONG_MODE": "wrong_mode",
    "WRONG_PREV_LEN": "wrong_prev_len",
    "WRONG_DELTA_LEN": "wrong_delta_len",
    "WRONG_CUM_LEN": "wrong_cum_len",
    "WRONG_WEIGHT_VERSION": "wrong_weight_version",
    "WRONG_DIGEST": "wrong_digest",
    "WRONG_EXTRAS_DIGEST": "wrong_extras_digest",
    "WRONG_CHAIN_HASH": "wrong_chain_hash",
    "WRONG_CUMULATIVE_HASH": "wrong_cumulative_hash",
    "WRONG_SCHEMA_VERSION": "wrong_schema_version",
    "WRONG_DIGEST_VERSION": "wrong_digest_version",
    "WRONG_EXTRAS_DIGEST_VERSION": "wrong_extras_digest_version",
    "INVALID_SNAPSHOT": "invalid_snapshot",
    "CORRUPT_DIGEST": "corrupt_digest",
    "MISSING_PARENT": "missing_parent",
    "PARENT_LENGTH_MISMATCH": "parent_length_mismatch",
    "LINEAGE_CYCLE": "lineage_cycle",
    "MISSING_TERMINAL": "missing_terminal",
    "CHAIN_HASH_MISMATCH": "chain_hash_mismatch",
    "INVALID_MASK_ORDER": "invalid_mask_order",
    "EMPTY_GENERATION": "empty_generation",
    "EMPTY_TRAINING_ROW": "empty_training_row",
    "CUMULATIVE_HASH_MISMATCH": "cumulative_hash_mismatch",
    "MISSING_EXTRAS": "missing_extras",
    "INVALID_EXTRAS": "invalid_extras",
    "EXTRAS_DIGEST_MISMATCH": "extras_digest_mismatch",
}


def test_mask_reasons_are_exactly_the_published_codes() -> None:
    """Every MaskReason member keeps its name and its string value; none is added or lost."""
    assert {reason.name: reason.value for reason in MaskReason} == _PUBLISHED


def test_mask_reason_is_a_string_enum() -> None:
    """A MaskReason compares equal to its code, so readers of plain strings see no change."""
    assert issubclass(MaskReason, StrEnum)
    assert MaskReason.EMPTY_CAPTURE == "empty_capture"


def test_build_json_carries_the_reason_as_a_plain_string() -> None:
    """The build's JSON form and the record's capture hold a str, not the enum member."""
    build = rebuild_snapshot(snapshot_of([]))
    assert build.mask_reason is MaskReason.EMPTY_CAPTURE
    assert type(build.to_dict()["mask_reason"]) is str
    assert type(build.record_capture()["mask_reason"]) is str


def test_unusable_build_metrics_carry_the_reason_as_a_plain_string() -> None:
    """An unusable build's metrics (the record's `_ng_token_capture`) hold a str reason."""
    build = Build.unusable("no capture key", mask_reason=MaskReason.NO_CAPTURE_KEY)
    assert type(build.metrics["mask_reason"]) is str
    assert build.metrics["mask_reason"] == "no_capture_key"


def test_a_masked_chain_names_its_reason_as_a_member() -> None:
    """A built but masked chain carries its reason as a MaskReason member."""
    entries = [make_entry("r", "c1", [1], [2]), make_entry("r", "c2", [7], [8], created_at=1.0)]
    build = rebuild_snapshot(snapshot_of(entries), terminal_attribution=False)
    assert build.mask_reason is MaskReason.MULTIPLE_ROOTS
