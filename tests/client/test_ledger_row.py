"""The ledger row the client computes for a commit, against NeMo Gym 0.7.0's own rows.

The vectors hold the rows Gym's file ledger wrote (tests/vectors/nemo_gym_0_7_staging):
ledger.json as the exact text of each line, scenarios.json as parsed rows.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from tests.support.staging_vectors import staging_cases
from token_finalizer_client._ledger_row import committed_row
from token_finalizer_client.protocol import FingerprintError


def _line(row: dict[str, Any]) -> str:
    """A row as Gym's file ledger writes it: sorted keys, compact JSON."""
    return json.dumps(row, sort_keys=True, separators=(",", ":"))


def _written_ledger_commits() -> list[tuple[str, dict[str, Any], list[str]]]:
    """(case, commit, the file ledger's lines) for every record Gym's file ledger accepted."""
    found = []
    for case in staging_cases("ledger.json"):
        expected = case["expected"]["file"]
        for op, outcome in zip(case["inputs"]["ops"], expected["results"], strict=True):
            if op["op"] == "record" and "error" not in outcome:
                lines = expected["lines"][op["commit"]["rollout_id"]]
                found.append((case["name"], op["commit"], lines))
    return found


def _scenario_commits() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(scenario, commit, Gym's stored row) for every commit of a file-ledger scenario."""
    found = []
    for case in staging_cases("scenarios.json"):
        if case["inputs"]["ledger"] != "file":
            continue
        rows = {
            row["model_call_id"]: row
            for row in case["expected"]["ledger_rows"]
            if "failure_reason" not in row
        }
        for call in case["expected"]["calls"]:
            for op in call.get("ledger_ops", []):
                if op["op"] == "record":
                    commit = op["args"]["commit"]
                    row = rows[commit["record"]["model_call_id"]]
                    found.append((case["name"], commit, row))
    return found


LEDGER_COMMITS = _written_ledger_commits()
SCENARIO_COMMITS = _scenario_commits()
COMMIT = SCENARIO_COMMITS[1][1]  # clean_chain's c2: a token_in call with a parent


class _PydanticLike:
    """What the client reads of Gym's CaptureLedgerCommit: `model_dump(mode="json")`."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data
        self.modes: list[str] = []

    def model_dump(self, *, mode: str = "python") -> dict[str, Any]:
        self.modes.append(mode)
        return copy.deepcopy(self._data)


@pytest.mark.parametrize(
    ("case", "commit", "lines"), LEDGER_COMMITS, ids=[c[0] for c in LEDGER_COMMITS]
)
def test_row_is_a_line_of_gyms_file_ledger(
    case: str, commit: dict[str, Any], lines: list[str]
) -> None:
    """Every row Gym's file ledger wrote is, as text, exactly the row the client computes."""
    assert _line(committed_row(commit).row) in lines


@pytest.mark.parametrize(
    ("case", "commit", "row"),
    SCENARIO_COMMITS,
    ids=[f"{c[0]}-{i}" for i, c in enumerate(SCENARIO_COMMITS)],
)
def test_row_equals_gyms_scenario_row(
    case: str, commit: dict[str, Any], row: dict[str, Any]
) -> None:
    """Every committed row of the end-to-end scenarios equals the client's, key for key."""
    assert committed_row(commit).row == row


def test_row_names_its_rollout_and_call() -> None:
    """The result carries the commit's rollout id and model call id beside the row."""
    committed = committed_row(COMMIT)
    assert (committed.rollout_id, committed.model_call_id) == (
        COMMIT["rollout_id"],
        COMMIT["record"]["model_call_id"],
    )


def test_a_pydantic_commit_is_read_in_json_mode() -> None:
    """A pydantic commit is dumped with mode="json" and gives the mapping's row."""
    model = _PydanticLike(COMMIT)
    assert committed_row(model).row == committed_row(COMMIT).row
    assert model.modes == ["json"]


def test_a_mapping_may_leave_out_what_the_model_defaults() -> None:
    """Without the defaulted fields a mapping gives the row the model's defaults give."""
    commit = copy.deepcopy(COMMIT)
    for name in ("output_fingerprint", "continuation_fingerprint", "admitted_at"):
        del commit["record"][name]
    row = committed_row(commit).row
    assert (row["output_fingerprint"], row["continuation_fingerprint"], row["admitted_at"]) == (
        None,
        None,
        None,
    )


def test_a_missing_fingerprint_version_defaults_to_zero() -> None:
    """A record without fingerprint_version stores 0, the model's default."""
    commit = copy.deepcopy(COMMIT)
    del commit["record"]["fingerprint_version"]
    assert committed_row(commit).row["fingerprint_version"] == 0


def test_an_integral_admitted_at_is_stored_as_a_float() -> None:
    """An int admission time is written as the float Gym's model would hold (one row either way)."""
    commit = copy.deepcopy(COMMIT)
    commit["record"]["admitted_at"] = 1767225600
    assert _line(committed_row(commit).row).count('"admitted_at":1767225600.0') == 1


def test_empty_fingerprints_are_stored_as_null() -> None:
    """An empty output fingerprint is null in the row, as Gym stores it."""
    commit = copy.deepcopy(COMMIT)
    commit["record"]["output_fingerprint"] = ""
    assert committed_row(commit).row["output_fingerprint"] is None


def test_a_missing_required_field_is_named() -> None:
    """A record without its staging_key is refused with a ValueError naming it."""
    commit = copy.deepcopy(COMMIT)
    del commit["record"]["staging_key"]
    with pytest.raises(ValueError, match="staging_key"):
        committed_row(commit)


def test_a_bad_rollout_id_is_refused() -> None:
    """A rollout id outside the store's alphabet raises a ValueError, as Gym's file ledger does."""
    commit = dict(COMMIT, rollout_id="bad id")
    with pytest.raises(ValueError, match="rollout_id"):
        committed_row(commit)


def test_items_that_are_not_a_list_are_refused() -> None:
    """request_items given as a string is a ValueError, not a fingerprint of its characters."""
    commit = dict(COMMIT, request_items="hello")
    with pytest.raises(ValueError, match="request_items"):
        committed_row(commit)


def test_items_the_rules_leave_open_raise() -> None:
    """An item that is not an object cannot be fingerprinted: FingerprintError (a ValueError)."""
    commit = dict(COMMIT, response_items=[["not", "an", "object"]])
    with pytest.raises(FingerprintError):
        committed_row(commit)


def test_something_else_is_a_type_error() -> None:
    """Neither a mapping nor a pydantic model: TypeError."""
    with pytest.raises(TypeError, match="CaptureLedgerCommit"):
        committed_row(42)
