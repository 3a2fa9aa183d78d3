"""Stage-time custody checks over records staged by NeMo Gym 0.7.0's own worker."""

from __future__ import annotations

from typing import Any

import pytest

from tests.service.core.staging._calls import staged_call
from tests.support.staging_core_vectors import load_core_vectors, verification_inputs
from token_finalizer.core.staging import (
    CustodyRefusal,
    StagedCallBaseSnapshot,
    admit_staged_record,
    check_custody,
)

VECTORS = load_core_vectors("core_verify.json")
GOLDEN = load_core_vectors("golden_vectors.json")


def _staged(case_name: str) -> dict[str, StagedCallBaseSnapshot]:
    """The snapshots of a verification case (untampered), by call id."""
    case = next(case for case in VECTORS["cases"] if case["name"] == case_name)
    _, snapshots = verification_inputs(VECTORS, {**case, "snapshot_tamper": []})
    return {snapshot.model_call_id: snapshot for snapshot in snapshots}


FAULTS = _staged("wrong_prefix_at_terminal")  # a -> b -> c; e, w -> w2, f on a/b
BRANCH = _staged("retry_branch")  # a -> b -> c, a -> b2 -> d, s
SHORT = _staged("parent_length_mismatch")  # p admitted at 4 under a (ends at 5)


def _refusal(record: StagedCallBaseSnapshot, ancestors: list[StagedCallBaseSnapshot]) -> str:
    with pytest.raises(CustodyRefusal) as caught:
        check_custody(record, ancestors)
    return caught.value.check


@pytest.mark.parametrize(
    ("call_id", "chain"),
    [("a", []), ("b", ["a"]), ("c", ["a", "b"]), ("b2", ["a"]), ("d", ["a", "b2"]), ("s", [])],
)
def test_clean_reference_records_pass(call_id: str, chain: list[str]) -> None:
    """Every call the reference worker staged on a correct prefix passes."""
    check_custody(BRANCH[call_id], [BRANCH[ancestor] for ancestor in chain])


def test_empty_generation_is_not_a_custody_matter() -> None:
    """A call that generated nothing extends its parent exactly; verification refuses it later."""
    check_custody(FAULTS["e"], [FAULTS["a"]])


def test_wrong_worker_prefix_is_refused() -> None:
    """A call generated on a wrong prefix fails the cumulative hash check."""
    assert _refusal(FAULTS["w"], [FAULTS["a"], FAULTS["b"]]) == "cumulative_hash_mismatch"


def test_forged_parent_chain_hash_is_refused() -> None:
    """A call chained onto a forged parent hash fails the chain hash check."""
    assert _refusal(FAULTS["f"], [FAULTS["a"]]) == "chain_hash_mismatch"


def test_short_prev_len_is_refused() -> None:
    """A call that starts before its parent ends fails the length check."""
    assert _refusal(SHORT["p"], [SHORT["a"]]) == "parent_length_mismatch"


def test_missing_parent_is_refused() -> None:
    """A token_in call whose parent is not staged is refused."""
    assert _refusal(BRANCH["b"], []) == "parent_not_staged"


def test_other_parent_is_refused() -> None:
    """Ancestors ending at another call than the named parent are refused as not staged."""
    assert _refusal(BRANCH["c"], [BRANCH["a"], BRANCH["b2"]]) == "parent_not_staged"


def test_broken_ancestry_is_refused() -> None:
    """Ancestors that do not link root to parent are refused."""
    assert _refusal(BRANCH["c"], [BRANCH["s"], BRANCH["b"]]) == "parent_chain_broken"


def test_ancestor_of_another_rollout_is_refused() -> None:
    """Every ancestor must belong to the record's rollout."""
    other = staged_call(rollout_id="elsewhere", model_call_id="a", prompt=[1, 2, 3])
    assert _refusal(BRANCH["b"], [other]) == "parent_chain_broken"


def test_root_with_foreign_chain_hash_is_refused() -> None:
    """A root must chain from nothing."""
    record = staged_call(model_call_id="root")
    object.__setattr__(record, "chain_hash", BRANCH["a"].chain_hash)
    assert _refusal(record, []) == "chain_hash_mismatch"


def test_root_whose_cumulative_hash_is_not_its_delta_is_refused() -> None:
    """A root's cumulative hash must be the hash of its own delta."""
    record = staged_call(model_call_id="root")
    forged = staged_call(model_call_id="root", generated=[3])
    object.__setattr__(record, "cumulative_hash", forged.cumulative_hash)
    assert _refusal(record, []) == "cumulative_hash_mismatch"


def test_ancestors_of_a_root_are_ignored() -> None:
    """A root carries nothing, whatever ancestors a caller passes."""
    check_custody(BRANCH["s"], [BRANCH["a"]])


def test_admit_reads_a_reference_record() -> None:
    """A record the reference staged is admitted, extras included."""
    data: dict[str, Any] = {
        **GOLDEN["staged_call"],
        "digest": GOLDEN["staged_call_digest"],
        "extras": GOLDEN["extras"],
    }
    assert admit_staged_record(data).extras == GOLDEN["extras"]


def test_admit_refuses_an_invalid_record() -> None:
    """A record breaking the reference's rules is an invalid_record refusal naming the field."""
    data = {**GOLDEN["staged_call"], "digest": "0" * 64, "extras": GOLDEN["extras"]}
    with pytest.raises(CustodyRefusal) as caught:
        admit_staged_record(data)
    assert caught.value.check == "invalid_record"
    assert "digest" in caught.value.detail


def test_refusal_text_names_the_check() -> None:
    """str(refusal) starts with the check, ready for StageResult.error."""
    with pytest.raises(CustodyRefusal) as caught:
        check_custody(BRANCH["b"], [])
    assert str(caught.value).startswith("parent_not_staged: ")
