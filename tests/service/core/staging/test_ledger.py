"""Ledger rows, write-once, manifests and resolution, against NeMo Gym 0.7.0's file ledger."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.staging_core_vectors import case_ids, load_core_vectors
from tests.support.staging_stores import row_of_commit
from token_finalizer.core.staging import (
    CallRecord,
    LedgerConflict,
    LedgerWrite,
    StagingRecordError,
    commit_row,
    failure_row,
    manifest_from_rows,
    plan_commit,
    plan_failure,
    resolve_ledger,
    resolve_ledger_items,
)

VECTORS = load_core_vectors("core_ledger.json")
WRITES = VECTORS["writes"]
MANIFESTS = VECTORS["manifests"]
RESOLUTIONS = VECTORS["resolutions"]
WHOLE = next(case for case in WRITES if case["name"] == "whole_rollout")
ROWS: list[dict[str, Any]] = WHOLE["expected"]["rows"]


def _replay(operations: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """Apply the operations to an in-memory ledger with our write rules."""
    rows: list[dict[str, Any]] = []
    outcomes: list[str] = []
    for operation in operations:
        if operation["op"] == "record":
            row = row_of_commit(operation["commit"])
            try:
                decision = plan_commit(rows, row)
            except LedgerConflict:
                outcomes.append("conflict")
                continue
        else:
            row = failure_row(operation["model_call_id"], operation["reason"])
            decision = plan_failure(rows, row)
        if decision is LedgerWrite.APPEND:
            rows.append(row)
        outcomes.append("ok")
    return outcomes, rows


@pytest.mark.parametrize("case", WRITES, ids=case_ids(WRITES))
def test_write_outcomes_match_reference(case: dict[str, Any]) -> None:
    """Each write succeeds, replays or conflicts as in the reference ledger."""
    outcomes, _ = _replay(case["operations"])
    assert outcomes == case["expected"]["outcomes"]


@pytest.mark.parametrize("case", WRITES, ids=case_ids(WRITES))
def test_written_rows_match_reference(case: dict[str, Any]) -> None:
    """The rows written are the reference ledger's rows, key for key."""
    _, rows = _replay(case["operations"])
    assert rows == case["expected"]["rows"]


@pytest.mark.parametrize("case", WRITES, ids=case_ids(WRITES))
def test_manifest_of_writes_matches_reference(case: dict[str, Any]) -> None:
    """The manifest of the written rows is the reference ledger's manifest."""
    _, rows = _replay(case["operations"])
    assert manifest_from_rows("rollout-7", rows).to_json() == case["expected"]["manifest"]


@pytest.mark.parametrize("case", MANIFESTS, ids=case_ids(MANIFESTS))
def test_manifest_of_rows_matches_reference(case: dict[str, Any]) -> None:
    """Hand-written rows (missing ids or hashes, foreign rows) give the reference's manifest."""
    assert manifest_from_rows("rollout-7", case["rows"]).to_json() == case["expected"]


@pytest.mark.parametrize("case", RESOLUTIONS, ids=case_ids(RESOLUTIONS))
def test_resolution_matches_reference_or_documented_choice(case: dict[str, Any]) -> None:
    """Status and match are the reference's, or docs/staging.md's where a note says so."""
    resolution = resolve_ledger_items(case["rows"], case["request_items"])
    match = None if resolution.match is None else resolution.match.to_json()
    assert {"status": resolution.status, "match": match} == case["expected"]


def test_commit_replay_is_a_replay() -> None:
    """The identical row again needs no write."""
    assert plan_commit(ROWS, dict(ROWS[0])) is LedgerWrite.REPLAY


def test_commit_with_other_admission_time_conflicts() -> None:
    """Any difference, admitted_at included, is a conflict."""
    with pytest.raises(LedgerConflict):
        plan_commit(ROWS, {**ROWS[0], "admitted_at": 1.5})


def test_commit_after_failure_conflicts() -> None:
    """A failure row holds the call id: a later commit conflicts."""
    with pytest.raises(LedgerConflict):
        plan_commit([failure_row("a", "unresolved_parent")], ROWS[0])


def test_new_commit_appends() -> None:
    """A call id never written appends."""
    assert plan_commit(ROWS[1:], ROWS[0]) is LedgerWrite.APPEND


def test_identical_failure_is_a_replay() -> None:
    """The same (call id, reason) again needs no write."""
    rows = [failure_row("a", "unresolved_parent")]
    assert plan_failure(rows, failure_row("a", "unresolved_parent")) is LedgerWrite.REPLAY


def test_failure_with_new_reason_appends() -> None:
    """Another reason for the same call is a further row."""
    rows = [failure_row("a", "unresolved_parent")]
    assert plan_failure(rows, failure_row("a", "worker_capture_failed")) is LedgerWrite.APPEND


def test_failure_after_commit_appends() -> None:
    """A failure after the call's commit is a further row."""
    assert plan_failure(ROWS, failure_row("a", "worker_capture_failed")) is LedgerWrite.APPEND


def test_failure_row_refuses_empty_reason() -> None:
    """A failure needs a reason."""
    with pytest.raises(StagingRecordError):
        failure_row("a", "")


def test_commit_row_refuses_malformed_fingerprint() -> None:
    """The fingerprint is empty or lowercase hex."""
    record = CallRecord.from_json(WHOLE["operations"][0]["commit"]["record"])
    with pytest.raises(StagingRecordError) as caught:
        commit_row(
            record, staging_chain=[], fingerprint="XYZ", context_len=0, context_digest="0" * 64
        )
    assert caught.value.field == "fingerprint"


def test_manifest_refuses_a_row_without_lengths() -> None:
    """A committed row missing a required column cannot become a manifest row."""
    row = {key: value for key, value in ROWS[0].items() if key != "prev_len"}
    with pytest.raises(StagingRecordError) as caught:
        manifest_from_rows("r", [row])
    assert caught.value.field == "prev_len"


def test_empty_ledger_gives_empty_manifest() -> None:
    """An unknown rollout has an empty manifest."""
    assert manifest_from_rows("r", []).to_json() == {
        "schema_version": 2,
        "rollout_id": "r",
        "records": [],
        "failures": [],
    }


def test_resolution_ignores_failure_rows() -> None:
    """A failure row never resolves as a parent, even with a matching fingerprint."""
    failure = {**ROWS[0], **failure_row("zz", "unresolved_parent")}
    digests = ["0" * 64] * ROWS[0]["context_len"] + [ROWS[0]["context_digest"]]
    assert resolve_ledger([ROWS[0]], ROWS[0]["fingerprint"], digests).status == "resolved"
    assert resolve_ledger([failure], ROWS[0]["fingerprint"], digests).reason == "no_match"


def test_resolution_needs_fingerprint_version_2() -> None:
    """A row stamped with another fingerprint version is no candidate."""
    row = {**ROWS[0], "fingerprint_version": 0}
    digests = ["0" * 64] * ROWS[0]["context_len"] + [ROWS[0]["context_digest"]]
    assert resolve_ledger([row], row["fingerprint"], digests).reason == "no_match"


def test_resolution_of_different_candidates_is_ambiguous() -> None:
    """Two rows with one fingerprint and context but different sequences stay unresolved."""
    other = {**ROWS[0], "model_call_id": "a2", "cumulative_hash": "f" * 64}
    digests = ["0" * 64] * ROWS[0]["context_len"] + [ROWS[0]["context_digest"]]
    resolution = resolve_ledger([ROWS[0], other], ROWS[0]["fingerprint"], digests)
    assert (resolution.status, resolution.reason) == ("unresolved", "ambiguous")


def test_resolution_of_malformed_row_is_lookup_error() -> None:
    """A candidate whose cum_len is not an integer answers lookup_error, never raises."""
    row = {**ROWS[0], "cum_len": "5"}
    digests = ["0" * 64] * ROWS[0]["context_len"] + [ROWS[0]["context_digest"]]
    assert resolve_ledger([row], row["fingerprint"], digests).reason == "lookup_error"


def test_resolution_of_unfingerprintable_items_is_lookup_error() -> None:
    """Items that cannot be fingerprinted answer lookup_error."""
    resolution = resolve_ledger_items(ROWS, ["not an object"])
    assert (resolution.status, resolution.reason) == ("unresolved", "lookup_error")


def test_resolution_without_model_output_is_root() -> None:
    """A request with no model-authored item is a root."""
    resolution = resolve_ledger_items(ROWS, [{"role": "user", "content": "hi"}])
    assert (resolution.status, resolution.match) == ("root", None)
