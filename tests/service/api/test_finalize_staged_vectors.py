"""POST /finalize reproduces NeMo Gym 0.7.0's trainer on every staging vector, on every store.

scenarios.json: each rollout is written into a memory, a file and a redis
store as Gym's capture path wrote it (`replay_scenario`), then each of its
finalize requests goes through the app: the receipt, the row or the error
(class, code, detail) are Gym's, `mask_reason` is the code, and only a
verified row is retirable. Where our product decides otherwise, the test
says so (`DECIDED_OTHERWISE`): a forged chain link or a wrong prefix is
refused when it is staged (our custody checks), so Gym records
`worker_capture_failed` for that call and the rollout is poisoned
(`rollout_failed`) instead of failing verification or, mid-chain, being
trained on. An identical retry resolves on our ledger (Gym's in-memory
ledger's rule; its file ledger leaves it unresolved): the file-ledger
scenario is replayed with the writes Gym's file ledger made, so it answers
what Gym answered, and `identical_retry_memory_ledger` is what a Gym model
server on our ledger writes.

verification.json: each tampered receipt and snapshot set becomes a store
state (its manifest as ledger rows, its snapshots as staged calls, written
through the store's raw layer where the store refuses them) and the record
the receipt was scored from; the answer carries Gym's code. Tampering our
service cannot express is listed in `NOT_A_STORE_STATE` with what we answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.staged_seeding import RawCall, replay_scenario, seed_rows, seed_staged
from tests.support.staged_service import STAGED_RETIRE, STORE_KINDS, StagedService, staged_service
from tests.support.staging_vectors import case_by_name, staging_case_ids, staging_cases
from token_finalizer.core.staging import CallRecord, StagingRecordError, commit_row

SCENARIOS = staging_cases("scenarios.json")
VERIFICATION = staging_cases("verification.json")
CLEAN = case_by_name("scenarios.json", "clean_chain")

# Our answer where our product decides otherwise than Gym 0.7.0 (the calls refused at stage).
_POISONED = {
    "class": "ReceiptVerificationError",
    "code": "rollout_failed",
    "detail": "worker_capture_failed",
}
DECIDED_OTHERWISE = {
    "forged_parent_chain_hash": _POISONED,
    "wrong_prefix_at_terminal": _POISONED,
    "wrong_prefix_mid_chain": _POISONED,
}


def _finalized(service: StagedService, case: dict[str, Any]) -> list[dict[str, Any]]:
    """Every finalize request of a scenario, answered in order on one frozen rollout."""
    rollout_id = case["inputs"]["rollout_id"]
    answers = []
    for request in case["inputs"]["finalize"]:
        answers.append(service.finalize({**request["record"], "_ng_rollout_id": rollout_id}))
    return answers


def _outcome(answer: dict[str, Any]) -> dict[str, Any]:
    staged = answer["staged"]
    if staged["row"] is not None:
        return {"row": staged["row"]}
    return {"error": staged["error"]}


def _expected(case: dict[str, Any], expected: dict[str, Any]) -> dict[str, Any]:
    if case["name"] in DECIDED_OTHERWISE:
        return {"error": DECIDED_OTHERWISE[case["name"]]}
    if "row" in expected:
        return {"row": expected["row"]}
    return {"error": expected["error"]}


@pytest.mark.parametrize("case", SCENARIOS, ids=staging_case_ids(SCENARIOS))
def test_scenario_rows_and_errors_are_gyms(service: StagedService, case: dict[str, Any]) -> None:
    """Each finalize answers Gym's row or error (ours where DECIDED_OTHERWISE says so)."""
    service.seed(lambda store: replay_scenario(store, case))
    answers = _finalized(service, case)
    assert [_outcome(answer) for answer in answers] == [
        _expected(case, expected) for expected in case["expected"]["finalize"]
    ]


@pytest.mark.parametrize(
    "case",
    [case for case in SCENARIOS if case["name"] not in DECIDED_OTHERWISE],
    ids=staging_case_ids([case for case in SCENARIOS if case["name"] not in DECIDED_OTHERWISE]),
)
def test_scenario_receipts_are_gyms(service: StagedService, case: dict[str, Any]) -> None:
    """The receipt of each finalize is the one Gym's trainer built from the same manifest."""
    service.seed(lambda store: replay_scenario(store, case))
    answers = _finalized(service, case)
    assert [answer["staged"]["receipt"] for answer in answers] == [
        expected["receipt"] for expected in case["expected"]["finalize"]
    ]


@pytest.mark.parametrize("case", SCENARIOS, ids=staging_case_ids(SCENARIOS))
def test_scenario_masks_with_the_code_and_tickets_only_rows(
    service: StagedService, case: dict[str, Any]
) -> None:
    """A failure masks the record with its code; a verified row is unmasked and retirable."""
    service.seed(lambda store: replay_scenario(store, case))
    for answer in _finalized(service, case):
        error = answer["staged"]["error"]
        capture = answer["record"]["_ng_token_capture"]
        if error is None:
            assert (answer["retirable"], "mask_sample" in answer["record"]) == (True, False)
        else:
            assert (answer["retirable"], answer["record"]["mask_sample"]) == (False, True)
            assert capture["mask_reason"] == answer["build"]["mask_reason"] == error["code"]


@pytest.mark.parametrize("case", SCENARIOS, ids=staging_case_ids(SCENARIOS))
def test_scenario_records_are_never_rebuilt(service: StagedService, case: dict[str, Any]) -> None:
    """The answered record's response is the one sent (rebuild_response is false)."""
    service.seed(lambda store: replay_scenario(store, case))
    for request, answer in zip(case["inputs"]["finalize"], _finalized(service, case), strict=True):
        assert answer["record"].get("response") == request["record"].get("response")


# -- verification.json ------------------------------------------------------------------------

# Tampering that no store state expresses, and what our finalize answers instead ("row": the
# rollout verifies as stored). The service builds the receipt from the frozen ledger, whose
# rows carry no versions, and a freeze gives one snapshot (or none) per record.
NOT_A_STORE_STATE = {
    # Receipt fields no ledger holds: our receipts always have versions 2, 2, 1.
    "unsupported_schema": "row",
    "unsupported_digest": "row",
    "unsupported_extras_digest": "row",
    # Our receipts are poisoned only with a reason (a failure row, or the terminal selection).
    "capture_poisoned": "row",
    # A terminal outside the manifest, or none while unpoisoned: our policy names a row or
    # poisons (Gym's receipt model refuses both receipts too); here the scored response's.
    "missing_terminal_absent": "row",
    "missing_terminal_none": "row",
    # A manifest row's versions: ledger rows have no version columns.
    "wrong_schema_version": "row",
    "wrong_digest_version": "row",
    "wrong_extras_digest_version": "row",
    # A ledger without rows holds nothing: an empty capture.
    "empty_manifest": "empty_capture",
    # A record the store does not hold: our own code, checked before verification.
    "row_count_mismatch": "staged_record_missing",
    # A manifest row Gym's own row model refuses: a ledger holding it cannot be frozen.
    "wrong_mode": "freeze_failed",
    "wrong_cum_len": "freeze_failed",
}
# A staged call kept under another call's id: the file store keys a call by its own id.
UNDER_ANOTHER_ID = {"duplicate_snapshot", "snapshot_identity_mismatch", "snapshot_order_mismatch"}
_EXTRAS = {
    stored["record"]["model_call_id"]: stored["record"]["extras"]
    for stored in CLEAN["expected"]["staged_records"].values()
}


def _ledger_row(record: dict[str, Any]) -> dict[str, Any]:
    """The committed row of a manifest record (its columns as they are when no row makes it)."""
    lookup = {"fingerprint": "", "context_len": 0, "context_digest": "0" * 64}
    try:
        return commit_row(CallRecord.from_json(record), staging_chain=[], **lookup)
    except StagingRecordError:
        return {
            **{k: v for k, v in record.items() if k not in ("digest", "schema_version")},
            **lookup,
            "digest": record["cumulative_hash"],
            "staging_digest": record["digest"],
            "staging_chain": [],
            "schema_version": record["schema_version"],
        }


def _seed_case(service: StagedService, case: dict[str, Any]) -> str:
    receipt, snapshots = case["inputs"]["receipt"], case["inputs"]["snapshots"]
    rollout_id = receipt["rollout_id"]
    rows = [_ledger_row(record) for record in receipt["manifest"]]
    if receipt["failure_reason"] is not None:
        first = receipt["manifest"][0]["model_call_id"]
        rows.append({"failure_reason": receipt["failure_reason"], "model_call_id": first})
    calls = [
        RawCall(record["model_call_id"], snapshot, _EXTRAS.get(snapshot["model_call_id"]))
        for record, snapshot in zip(receipt["manifest"], snapshots, strict=False)
    ]

    async def seed(store: Any) -> None:
        await seed_staged(store, rollout_id, calls)
        await seed_rows(store, rollout_id, rows)

    service.seed(seed)
    return rollout_id


def _record(case: dict[str, Any]) -> dict[str, Any]:
    """The finished record the receipt was scored from: the terminal's served response id,
    and the terminal named explicitly (two rows may share a served id)."""
    receipt = case["inputs"]["receipt"]
    terminal = receipt["terminal_model_call_id"]
    served = {row["model_call_id"]: row["response_id"] for row in receipt["manifest"]}
    response = {"id": served.get(terminal, "chatcmpl-c3"), "object": "response", "output": []}
    record = {"_ng_rollout_id": receipt["rollout_id"], "response": response, "reward": 1.0}
    if terminal in served:
        record["_ng_terminal_model_call_id"] = terminal
    return record


def _expressed(kind: str) -> list[dict[str, Any]]:
    skipped = set(NOT_A_STORE_STATE) | (UNDER_ANOTHER_ID if kind == "file" else set())
    return [case for case in VERIFICATION if case["name"] not in skipped]


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_tampered_stores_answer_gyms_codes(kind: str, tmp_path: Path, redis_prefix: str) -> None:
    """Every tampering a store can hold answers Gym's row or error (class, code, detail)."""
    outcomes, wanted = {}, {}
    for index, case in enumerate(_expressed(kind)):
        with staged_service(
            kind, tmp_path / f"c{index}", f"{redis_prefix}{index}:", **STAGED_RETIRE
        ) as service:
            _seed_case(service, case)
            answer = service.finalize(_record(case))
        outcomes[case["name"]] = _outcome(answer)
        expected = case["expected"]
        wanted[case["name"]] = _expected(case, expected)
    assert outcomes == wanted


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_untamperable_receipts_answer_ours(kind: str, tmp_path: Path, redis_prefix: str) -> None:
    """What no store state expresses answers as NOT_A_STORE_STATE says."""
    answered = {}
    for index, case in enumerate(VERIFICATION):
        if case["name"] not in NOT_A_STORE_STATE:
            continue
        with staged_service(
            kind, tmp_path / f"c{index}", f"{redis_prefix}{index}:", **STAGED_RETIRE
        ) as service:
            _seed_case(service, case)
            answer = service.finalize(_record(case))
        answered[case["name"]] = answer["build"].get("mask_reason", "row")
    assert answered == NOT_A_STORE_STATE
