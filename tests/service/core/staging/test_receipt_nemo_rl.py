"""The `nemo_rl` receipt policy: NeMo RL's three cheap differences from ours, one by one.

docs/staging.md#nemo-rls-receipt-policy. Rows as in test_receipt.py:
a -> b -> c, b2 an identical retry of b, s a second root.
"""

from __future__ import annotations

from tests.support.staging_core_vectors import load_core_vectors
from token_finalizer.core.staging import (
    CallRecord,
    ManifestFailure,
    ReceiptPolicy,
    RolloutManifest,
    build_receipt,
)

TERMINAL = load_core_vectors("core_terminal.json")
ROWS = tuple(
    CallRecord.from_json(row)
    for row in next(case for case in TERMINAL["attribution"] if case["name"] == "explicit")[
        "records"
    ]
)
NEMO_RL = ReceiptPolicy.NEMO_RL
UNCOMMITTED = ManifestFailure(
    model_call_id="x", reason="request_finished_without_staged_coordinates"
)


def _manifest(rows: tuple[CallRecord, ...] = ROWS, *failures: ManifestFailure) -> RolloutManifest:
    return RolloutManifest(rollout_id="rollout-7", records=rows, failures=failures)


def _without(*call_ids: str) -> tuple[CallRecord, ...]:
    return tuple(row for row in ROWS if row.model_call_id not in call_ids)


def test_ours_is_the_default() -> None:
    """Without a policy, an uncommitted call's failure row poisons, as rule 4 says."""
    receipt = build_receipt(_manifest(ROWS, UNCOMMITTED), {"response": {"id": "resp-c"}})
    assert receipt.failure_reason == "request_finished_without_staged_coordinates"


def test_an_uncommitted_calls_failure_does_not_poison() -> None:
    """nemo_rl: the rollout trains on the attributed terminal despite the uncommitted call."""
    record = {"response": {"id": "resp-c"}}
    receipt = build_receipt(_manifest(ROWS, UNCOMMITTED), record, policy=NEMO_RL)
    assert (receipt.capture_poisoned, receipt.failure_reason) == (False, None)
    assert receipt.terminal_model_call_id == "c"


def test_any_other_failure_still_poisons_with_the_first_poisoning_reason() -> None:
    """nemo_rl: the uncommitted row is skipped; the next failure's reason poisons."""
    failures = (UNCOMMITTED, ManifestFailure(model_call_id="y", reason="worker_capture_failed"))
    receipt = build_receipt(
        _manifest(ROWS, *failures), {"response": {"id": "resp-c"}}, policy=NEMO_RL
    )
    assert (receipt.capture_poisoned, receipt.failure_reason) == (True, "worker_capture_failed")


def test_a_failed_walk_is_the_bare_reason() -> None:
    """nemo_rl: `ambiguous_terminal`, not `terminal_selection:ambiguous_terminal`."""
    receipt = build_receipt(_manifest(_without("c")), {}, policy=NEMO_RL)
    assert (receipt.failure_reason, receipt.terminal_selection) == (
        "ambiguous_terminal",
        "heuristic",
    )


def test_an_unattributed_declared_terminal_is_missing_terminal_row() -> None:
    """nemo_rl: a declared id no row answers poisons with NeMo RL's `missing_terminal_row`."""
    receipt = build_receipt(_manifest(), {"terminal_response_id": "resp-zz"}, policy=NEMO_RL)
    assert (receipt.failure_reason, receipt.terminal_selection) == (
        "missing_terminal_row",
        "declared",
    )
    assert receipt.terminal_model_call_id is None


def test_the_explicit_terminal_id_is_not_read() -> None:
    """nemo_rl: `_ng_terminal_model_call_id` naming s is ignored; the walk picks c."""
    record = {"_ng_terminal_model_call_id": "s"}
    assert build_receipt(_manifest(), record).terminal_model_call_id == "s"
    receipt = build_receipt(_manifest(), record, policy=NEMO_RL)
    assert (receipt.terminal_model_call_id, receipt.terminal_selection) == ("c", "heuristic")


def test_the_record_is_not_changed() -> None:
    """Leaving the explicit id out of the witnesses does not remove it from the record."""
    record = {"_ng_terminal_model_call_id": "s"}
    build_receipt(_manifest(), record, policy=NEMO_RL)
    assert record == {"_ng_terminal_model_call_id": "s"}


def test_the_policies_agree_on_a_clean_attributed_rollout() -> None:
    """No failure, a served id naming a row: the same receipt under both policies."""
    record = {"response": {"id": "resp-c"}, "reward": 1.0}
    assert build_receipt(_manifest(), record, policy=NEMO_RL) == build_receipt(_manifest(), record)
