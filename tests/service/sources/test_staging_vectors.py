"""Our stores against NeMo Gym 0.7.0's ledger and capture path (tests/vectors/nemo_gym_0_7_staging).

ledger.json: every write, manifest and has_rows answers as Gym's file ledger
does (our rows are its rows, fingerprints included); every resolution answers
as Gym's in-memory ledger does, which collapses identical retries where the
file ledger cannot choose (DESIGN: the in-memory rule is ours).

scenarios.json: each scenario's calls replayed in order, every stage and
every ledger call Gym made, against our store: the same answers, then the
same manifest, and the staged snapshots of its records. Where we decide
otherwise the test says so: a wrong prefix or a forged chain link is refused
when it is staged (so the call never reaches a row), and an identical retry
resolves.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.staging_stores import resolution_of, row_of_commit, wire_attachments
from tests.support.staging_vectors import staging_case_ids, staging_cases
from token_finalizer.core.errors import CaptureConflict, InvalidRolloutId
from token_finalizer.core.staging import CustodyRefusal, StagedCallRecord

pytestmark = pytest.mark.anyio

LEDGER = [
    case
    for case in staging_cases("ledger.json")
    if not any(op["op"] == "append_raw_row" for op in case["inputs"]["ops"])
]
SCENARIOS = staging_cases("scenarios.json")

# Calls our custody checks refuse at stage time (0.7.0 stages them), with the check.
REFUSED_AT_STAGE = {
    "forged_parent_chain_hash": {"c2": "chain_hash_mismatch", "c3": "parent_not_staged"},
    "wrong_prefix_at_terminal": {"c3": "cumulative_hash_mismatch"},
    "wrong_prefix_mid_chain": {"c2": "cumulative_hash_mismatch", "c3": "parent_not_staged"},
}
# Resolutions where our collapse rule answers otherwise than 0.7.0's file ledger.
COLLAPSED = {("identical_retry_file_ledger", "c3"): "c2a"}


async def _ledger_op(store: Any, op: dict[str, Any]) -> dict[str, Any]:
    """One CaptureLedger call on our store, answered as the vectors record it."""
    name, args = op["op"], op.get("args", op)
    try:
        if name == "record":
            commit = args["commit"]
            await store.record_ledger_row(commit["rollout_id"], row_of_commit(commit))
            return {"result": None}
        if name == "record_failure":
            rid, call, reason = args["rollout_id"], args["model_call_id"], args["reason"]
            await store.record_ledger_failure(rid, call, reason)
            return {"result": None}
        if name == "has_rows":
            return {"result": await store.ledger_has_rows(args["rollout_id"])}
        if name == "manifest":
            return {"result": (await store.ledger_manifest(args["rollout_id"])).to_json()}
        if name == "resolve":
            items = args["request_items"]
            return {"result": await resolution_of(store, args["rollout_id"], items)}
    except (CaptureConflict, InvalidRolloutId) as error:
        return {"error": type(error).__name__}
    raise AssertionError(f"unknown ledger op {name}")


def _expected(op: dict[str, Any], file: dict[str, Any], memory: dict[str, Any]) -> dict[str, Any]:
    """Gym's answer we must give: the in-memory ledger's for resolutions, else the file ledger's."""
    chosen = memory if op["op"] == "resolve" else file
    if "error" in chosen:
        return {
            "error": "InvalidRolloutId"
            if "Invalid rollout id" in chosen["error"]
            else "CaptureConflict"
        }
    return chosen


@pytest.mark.parametrize("case", LEDGER, ids=staging_case_ids(LEDGER))
async def test_ledger_answers_as_gym(store: Any, case: dict[str, Any]) -> None:
    """Each ledger call answers what Gym's ledger answered (resolutions: the in-memory rule)."""
    expected = case["expected"]
    answers, wanted = [], []
    for op, file, memory in zip(
        case["inputs"]["ops"],
        expected["file"]["results"],
        expected["memory"]["results"],
        strict=True,
    ):
        answers.append(await _ledger_op(store, {"op": op["op"], "args": op}))
        wanted.append(_expected(op, file, memory))
    assert answers == wanted


def _record_of(case: dict[str, Any], staging_key: str) -> tuple[StagedCallRecord, Any] | None:
    stored = case["expected"]["staged_records"].get(staging_key)
    if stored is None:
        return None  # the sink refused it: nothing was kept
    return StagedCallRecord.from_json(stored["record"]), wire_attachments(stored["attachments"])


async def _replay(store: Any, case: dict[str, Any]) -> dict[str, str]:
    """Every stage and ledger call of the scenario, in order; the calls refused at stage time."""
    name, refused = case["name"], {}
    rollout_id = case["inputs"]["rollout_id"]
    for call in case["expected"]["calls"]:
        for op in call.get("ledger_ops", []):
            if op["op"] == "resolve" and (name, call["model_call_id"]) in COLLAPSED:
                answer = await resolution_of(store, rollout_id, op["args"]["request_items"])
                assert answer["match"]["model_call_id"] == COLLAPSED[name, call["model_call_id"]]
                continue
            assert await _ledger_op(store, op) == {k: op[k] for k in ("result", "error") if k in op}
        for op in call.get("stage_ops", []):
            staged = _record_of(case, op["staging_key"])
            if staged is None:
                continue
            try:
                await store.stage(*staged)
            except CustodyRefusal as refusal:
                refused[staged[0].model_call_id] = refusal.check
    return refused


@pytest.mark.parametrize("case", SCENARIOS, ids=staging_case_ids(SCENARIOS))
async def test_scenario_replays_as_gym(store: Any, case: dict[str, Any]) -> None:
    """Every answer matches Gym's; only the calls our custody checks refuse are refused."""
    refused = await _replay(store, case)
    assert refused == REFUSED_AT_STAGE.get(case["name"], {})


@pytest.mark.parametrize("case", SCENARIOS, ids=staging_case_ids(SCENARIOS))
async def test_scenario_freezes_into_gyms_manifest(store: Any, case: dict[str, Any]) -> None:
    """The frozen manifest is the one Gym's control route served."""
    await _replay(store, case)
    staged = (await store.freeze(case["inputs"]["rollout_id"])).staged
    assert staged.manifest.to_json() == case["expected"]["manifest"]


@pytest.mark.parametrize("case", SCENARIOS, ids=staging_case_ids(SCENARIOS))
async def test_scenario_freezes_with_each_records_staged_call(
    store: Any, case: dict[str, Any]
) -> None:
    """Each manifest record comes with its staged base snapshot, None where we refused it."""
    await _replay(store, case)
    rollout_id = case["inputs"]["rollout_id"]
    staged = (await store.freeze(rollout_id)).staged
    refused = REFUSED_AT_STAGE.get(case["name"], {})
    expected = []
    for record in staged.manifest.records:
        found = _record_of(case, f"{rollout_id}/{record.model_call_id}")
        keep = found is not None and record.model_call_id not in refused
        expected.append(found[0].base_snapshot() if keep and found else None)
    assert list(staged.snapshots) == expected


@pytest.mark.parametrize(
    "case",
    [case for case in SCENARIOS if case["expected"]["orphan_staging_keys"]],
    ids=lambda case: case["name"],
)
async def test_scenario_orphans_are_reported(store: Any, case: dict[str, Any]) -> None:
    """A call staged but never committed (a lost acknowledgement) is an orphan in inspect."""
    await _replay(store, case)
    report = await store.admin.inspect(case["inputs"]["rollout_id"])
    orphans = [key.rsplit("/", 1)[1] for key in case["expected"]["orphan_staging_keys"]]
    assert list(report.staging.orphans) == orphans
