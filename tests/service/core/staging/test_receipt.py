"""The receipt policy: poisoning, witness methods, declared ids, the parent-link fallback."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.staging_core_vectors import load_core_vectors, verification_inputs
from token_finalizer.core.staging import (
    CallRecord,
    ManifestFailure,
    RolloutManifest,
    build_receipt,
    verify_and_linearize,
)

TERMINAL = load_core_vectors("core_terminal.json")
# a -> b -> c, b2 an identical retry of b, s a second root (docs/staging.md#receipt-policy).
ROWS = tuple(
    CallRecord.from_json(row)
    for row in next(case for case in TERMINAL["attribution"] if case["name"] == "explicit")[
        "records"
    ]
)
FINAL = [{"type": "message", "role": "assistant", "content": "Done: the fix is applied"}]


def _manifest(rows: tuple[CallRecord, ...] = ROWS, *failures: ManifestFailure) -> RolloutManifest:
    return RolloutManifest(rollout_id="rollout-7", records=rows, failures=failures)


def _without(*call_ids: str) -> tuple[CallRecord, ...]:
    return tuple(row for row in ROWS if row.model_call_id not in call_ids)


def test_response_id_names_the_terminal() -> None:
    """The scored response's id selects its call, method response_id."""
    receipt = build_receipt(_manifest(), {"response": {"id": "resp-c", "output": FINAL}})
    assert (receipt.terminal_model_call_id, receipt.terminal_selection) == ("c", "response_id")
    assert not receipt.capture_poisoned
    assert receipt.terminal_attribution_reason == "corroborated_by=content"


def test_explicit_call_id_maps_to_declared() -> None:
    """The explicit witness is recorded as declared (the receipt has no explicit value)."""
    receipt = build_receipt(_manifest(), {"_ng_terminal_model_call_id": "s"})
    assert (receipt.terminal_model_call_id, receipt.terminal_selection) == ("s", "declared")


def test_declared_response_id_selects_declared() -> None:
    """A declared response id selects its call, method declared."""
    receipt = build_receipt(_manifest(), {"terminal_response_id": "resp-b"})
    assert (receipt.terminal_model_call_id, receipt.terminal_selection) == ("b", "declared")


def test_content_maps_to_content() -> None:
    """A content match selects method content."""
    receipt = build_receipt(_manifest(), {"response": {"output": FINAL}})
    assert (receipt.terminal_model_call_id, receipt.terminal_selection) == ("c", "content")


def test_uncaptured_declared_id_poisons() -> None:
    """A declared id with no row poisons; no other call is substituted."""
    receipt = build_receipt(
        _manifest(), {"terminal_response_id": "resp-zz", "response": {"id": "resp-c"}}
    )
    assert receipt.capture_poisoned and receipt.terminal_model_call_id is None
    assert receipt.failure_reason == "terminal_selection:declared_terminal_not_captured"
    assert receipt.terminal_selection == "declared"


def test_declared_id_contradicted_by_a_witness_poisons() -> None:
    """A declared id another witness contradicts poisons with witness_disagreement."""
    receipt = build_receipt(
        _manifest(), {"terminal_response_id": "resp-s", "response": {"id": "resp-c"}}
    )
    assert receipt.failure_reason == "terminal_selection:witness_disagreement"


def test_no_witness_falls_back_to_the_walk() -> None:
    """Without witnesses the parent-link walk picks the terminal, method heuristic."""
    receipt = build_receipt(_manifest(), {"reward": 1.0})
    assert (receipt.terminal_model_call_id, receipt.terminal_selection) == ("c", "heuristic")
    assert not receipt.capture_poisoned


def test_undeclared_disagreement_falls_back_to_the_walk() -> None:
    """Disagreeing witnesses without a declared id fall back to the walk."""
    receipt = build_receipt(_manifest(), {"response": {"id": "resp-s", "output": FINAL}})
    assert (receipt.terminal_model_call_id, receipt.terminal_selection) == ("c", "heuristic")
    assert receipt.terminal_attribution_reason == "witness_disagreement[response_id=s;content=c]"


def test_failed_walk_poisons_with_its_reason() -> None:
    """When the walk cannot choose, the receipt is poisoned terminal_selection:<reason>."""
    receipt = build_receipt(_manifest(_without("c")), {})
    assert receipt.failure_reason == "terminal_selection:ambiguous_terminal"
    assert (receipt.terminal_selection, receipt.terminal_model_call_id) == ("heuristic", None)


def test_empty_manifest_poisons() -> None:
    """No rows at all: terminal_selection:no_records."""
    receipt = build_receipt(_manifest(()), {})
    assert receipt.failure_reason == "terminal_selection:no_records"


def test_failure_row_poisons_with_the_first_reason() -> None:
    """Any failure row poisons; the reason is the first failure's, the terminal still named."""
    failures = (
        ManifestFailure(model_call_id="x", reason="unresolved_parent"),
        ManifestFailure(model_call_id="y", reason="worker_capture_failed"),
    )
    receipt = build_receipt(_manifest(ROWS, *failures), {"response": {"id": "resp-c"}})
    assert (receipt.capture_poisoned, receipt.failure_reason) == (True, "unresolved_parent")
    assert receipt.terminal_model_call_id == "c"


def test_failure_row_outranks_a_selection_failure() -> None:
    """With failures and a failed walk, the failure reason is the first failure's."""
    failure = ManifestFailure(model_call_id="x", reason="unresolved_parent")
    receipt = build_receipt(_manifest(_without("c"), failure), {})
    assert receipt.failure_reason == "unresolved_parent"


@pytest.mark.parametrize(
    ("reward", "expected"),
    [(1, 1.0), (0.25, 0.25), (True, None), ("1", None), (float("nan"), None), (10**400, None)],
    ids=["int", "float", "bool", "string", "nan", "huge"],
)
def test_reward_is_kept_only_when_a_finite_number(reward: Any, expected: float | None) -> None:
    """The record's reward is copied when it is a finite number, else null."""
    assert build_receipt(_manifest(), {"reward": reward}).reward == expected


def test_built_receipt_verifies() -> None:
    """A receipt built for a clean chain's manifest verifies to the same row as the reference's."""
    vectors = load_core_vectors("core_verify.json")
    case = next(case for case in vectors["cases"] if case["name"] == "clean_chain")
    reference_receipt, snapshots = verification_inputs(vectors, case)
    manifest = RolloutManifest(rollout_id="rollout-7", records=reference_receipt.manifest)
    receipt = build_receipt(manifest, {"response": {"id": "resp-c"}})
    row = verify_and_linearize(receipt, snapshots)
    assert row.to_json() == case["expected"]["row"]
