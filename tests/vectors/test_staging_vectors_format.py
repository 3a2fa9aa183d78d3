"""The external-staging vector files load and every case carries what its family needs.

The files are test data computed by NeMo Gym 0.7.0 (see
tests/vectors/nemo_gym_0_7_staging/README.md); the conformance tests of the
staging implementation read them through tests.support.staging_vectors.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.staging_vectors import (
    CASE_FILES,
    STAGING_VECTORS,
    VectorCase,
    digest_family,
    golden_vectors,
    load_staging_vectors,
    staging_cases,
)

DIGEST_FAMILIES = (
    "token_hash",
    "chain_hash",
    "extras_digest",
    "staging_digest",
    "staging_delta",
    "routed_experts_envelope",
    "constants",
)

# Every code verify_and_linearize can raise from JSON inputs (empty_training_row
# cannot be reached: empty_generation fires first).
VERIFICATION_CODES = {
    "rollout_failed", "capture_poisoned", "empty_manifest", "unsupported_schema",
    "unsupported_digest", "unsupported_extras_digest", "duplicate_manifest_row",
    "duplicate_staging_key", "row_count_mismatch", "duplicate_snapshot",
    "snapshot_identity_mismatch", "snapshot_order_mismatch", "wrong_rollout",
    "wrong_parent_call_id", "wrong_mode", "wrong_prev_len", "wrong_delta_len", "wrong_cum_len",
    "wrong_weight_version", "wrong_digest", "wrong_extras_digest", "wrong_chain_hash",
    "wrong_cumulative_hash", "wrong_schema_version", "wrong_digest_version",
    "wrong_extras_digest_version", "invalid_snapshot", "corrupt_digest", "missing_parent",
    "parent_length_mismatch", "lineage_cycle", "missing_terminal", "chain_hash_mismatch",
    "invalid_mask_order", "empty_generation", "cumulative_hash_mismatch",
}  # fmt: skip

CALL_KEYS = {"model_call_id", "resolution", "admission", "committed", "ledger_ops", "stage_ops"}
SCENARIO_KEYS = {
    "calls",
    "staged_records",
    "orphan_staging_keys",
    "ledger_rows",
    "manifest",
    "finalize",
}


def all_cases() -> list[tuple[str, VectorCase]]:
    cases = [(name, case) for name in CASE_FILES for case in staging_cases(name)]
    return cases + [
        (f"digests.json:{f}", case) for f in DIGEST_FAMILIES for case in digest_family(f)
    ]


def outcome_of(expected: dict[str, Any]) -> str:
    """`row` or `error`, whichever the expected outcome holds (exactly one)."""
    held = {"row", "error"} & expected.keys()
    assert len(held) == 1, expected.keys()
    return held.pop()


@pytest.mark.parametrize("file_name", [*CASE_FILES, "digests.json"])
def test_each_file_names_its_generator_and_reference(file_name: str) -> None:
    """Every vector file says which script computed it from which release."""
    vectors = load_staging_vectors(file_name)
    assert vectors["generated_by"] == "tests/vectors/nemo_gym_0_7_staging/generate.py"
    assert vectors["reference"] == "nemo-gym 0.7.0"


@pytest.mark.parametrize(
    ("where", "case"), all_cases(), ids=[f"{where}:{case['name']}" for where, case in all_cases()]
)
def test_each_case_has_name_description_inputs_expected(where: str, case: VectorCase) -> None:
    """A case is named, described in words, and holds its inputs and expected values."""
    assert set(case) == {"name", "description", "inputs", "expected"}, where
    assert case["name"] and case["description"].strip()
    assert isinstance(case["inputs"], dict)


@pytest.mark.parametrize("file_name", CASE_FILES)
def test_case_names_are_unique_within_a_file(file_name: str) -> None:
    """Names identify cases, so a file never repeats one."""
    names = [case["name"] for case in staging_cases(file_name)]
    assert len(names) == len(set(names))


def test_digest_case_names_are_unique_across_families() -> None:
    """digests.json names are unique over all of its families."""
    names = [case["name"] for family in DIGEST_FAMILIES for case in digest_family(family)]
    assert len(names) == len(set(names))


def test_digests_json_holds_exactly_the_known_families() -> None:
    """The digest families are the ones the README describes."""
    assert set(load_staging_vectors("digests.json")["families"]) == set(DIGEST_FAMILIES)


@pytest.mark.parametrize("family", DIGEST_FAMILIES)
def test_digest_cases_expect_a_value_or_an_error(family: str) -> None:
    """Each digest case expects either a value or an error with its class and message."""
    for case in digest_family(family):
        expected = case["expected"]
        assert set(expected) in ({"value"}, {"error"}), case["name"]
        if "error" in expected:
            assert set(expected["error"]) == {"class", "message"}, case["name"]


@pytest.mark.parametrize("case", staging_cases("scenarios.json"), ids=lambda c: c["name"])
def test_scenario_records_every_layer(case: VectorCase) -> None:
    """A scenario holds per-call observations, staged records, ledger rows and manifest."""
    expected = case["expected"]
    assert set(expected) == SCENARIO_KEYS
    scripted = [call["model_call_id"] for call in case["inputs"]["calls"]]
    assert [call["model_call_id"] for call in expected["calls"]] == scripted
    for call in expected["calls"]:
        assert call.keys() >= CALL_KEYS, call["model_call_id"]
    assert set(expected["manifest"]) == {"schema_version", "rollout_id", "records", "failures"}


@pytest.mark.parametrize("case", staging_cases("scenarios.json"), ids=lambda c: c["name"])
def test_scenario_finalize_answers_every_request(case: VectorCase) -> None:
    """Each finalize request has a receipt, the fetched keys and exactly one outcome."""
    requests = case["inputs"]["finalize"]
    answers = case["expected"]["finalize"]
    assert [a["name"] for a in answers] == [r["name"] for r in requests]
    for answer in answers:
        assert {"attribution", "receipt", "fetched_keys"} <= answer.keys()
        if outcome_of(answer) == "row":
            assert all(check["ok"] for check in answer["extras_check"]), answer["name"]


@pytest.mark.parametrize("case", staging_cases("verification.json"), ids=lambda c: c["name"])
def test_verification_case_has_one_outcome(case: VectorCase) -> None:
    """A verification case expects a row or a classified error, and says what Gym validates."""
    expected = case["expected"]
    assert set(expected["gym_validation"]) == {"receipt", "snapshots"}
    assert len(expected["gym_validation"]["snapshots"]) == len(case["inputs"]["snapshots"])
    if outcome_of(expected) == "error":
        assert set(expected["error"]) == {"class", "code", "detail"}
        assert expected["error"]["class"] in {"ReceiptVerificationError", "RebuildError"}


def test_verification_reaches_every_code() -> None:
    """The tampered cases reach every verification code expressible in JSON."""
    codes = {
        case["expected"]["error"]["code"]
        for case in staging_cases("verification.json")
        if "error" in case["expected"]
    }
    assert codes == VERIFICATION_CODES


def test_linearized_rows_keep_float_columns() -> None:
    """Masks and log probs of every expected row are JSON floats, never ints."""
    rows = [
        c["expected"]["row"] for c in staging_cases("verification.json") if "row" in c["expected"]
    ]
    rows += [
        answer["row"]
        for case in staging_cases("scenarios.json")
        for answer in case["expected"]["finalize"]
        if "row" in answer
    ]
    assert rows
    for row in rows:
        assert all(type(value) is float for value in row["token_mask"] + row["logprobs"])


@pytest.mark.parametrize("case", staging_cases("ledger.json"), ids=lambda c: c["name"])
def test_ledger_case_answers_every_op_on_both_ledgers(case: VectorCase) -> None:
    """Both ledgers answer each op with a result or an error."""
    operations = case["inputs"]["ops"]
    for kind in ("file", "memory"):
        results = case["expected"][kind]["results"]
        assert len(results) == len(operations), kind
        assert all(set(result) in ({"result"}, {"error"}) for result in results), kind


@pytest.mark.parametrize("case", staging_cases("terminal.json"), ids=lambda c: c["name"])
def test_terminal_case_expects_what_its_function_answers(case: VectorCase) -> None:
    """resolve_terminal cases expect an attribution, select_terminal_call cases a selection."""
    keys = {
        "resolve_terminal": {"model_call_id", "method", "reason", "receipt_selection"},
        "select_terminal_call": {"terminal_model_call_id", "reason"},
    }[case["inputs"]["function"]]
    assert set(case["expected"]) == keys


@pytest.mark.parametrize("case", staging_cases("control_route.json"), ids=lambda c: c["name"])
def test_control_route_case_expects_status_and_body(case: VectorCase) -> None:
    """Each control-route request expects an HTTP status and a JSON body."""
    assert set(case["inputs"]) == {"rollout_id", "path", "headers"}
    assert case["expected"]["status"] in {200, 400, 401}
    assert isinstance(case["expected"]["body"], dict)


def test_golden_vectors_are_the_wheels_worked_example() -> None:
    """The copied golden file holds the extras and staged-call inputs with their digests."""
    golden = golden_vectors()
    assert set(golden) == {"extras", "extras_digest", "staged_call", "staged_call_digest"}
    assert golden["staged_call_digest"] == (
        "1122c7fe7e914c809eb9b1c09b26d94a50c1eb2790e7430fbcd8363b846ccf27"
    )


def test_readme_describes_every_data_file() -> None:
    """Every JSON file of the folder has a section in its README."""
    readme = (STAGING_VECTORS / "README.md").read_text("utf-8")
    for path in STAGING_VECTORS.glob("*.json"):
        assert f"### `{path.name}`" in readme, path.name
