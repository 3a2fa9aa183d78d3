"""verify_and_linearize and check_extras, checked against NeMo Gym 0.7.0's verifier."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.staging_core_vectors import case_ids, load_core_vectors, verification_inputs
from tests.support.staging_stores import manifest_row
from token_finalizer.core.staging import (
    RebuildError,
    ReceiptVerificationError,
    RolloutReceipt,
    StagedCallRecord,
    build_staged_call,
    check_extras,
    verify_and_linearize,
)

VECTORS = load_core_vectors("core_verify.json")
ROWS = [case for case in VECTORS["cases"] if "row" in case["expected"]]
ERRORS = [case for case in VECTORS["cases"] if "code" in case["expected"]]
CLEAN = next(case for case in VECTORS["cases"] if case["name"] == "clean_chain")
CLASSES = {"ReceiptVerificationError": ReceiptVerificationError, "RebuildError": RebuildError}
EXTRAS = {"routed_experts": [[[1, 2]], [[3, 4]]]}


@pytest.mark.parametrize("case", ROWS, ids=case_ids(ROWS))
def test_row_matches_reference(case: dict[str, Any]) -> None:
    """A verifiable receipt linearizes to the reference's row, field for field."""
    row = verify_and_linearize(*verification_inputs(VECTORS, case))
    assert row.to_json() == case["expected"]["row"]


@pytest.mark.parametrize("case", ERRORS, ids=case_ids(ERRORS))
def test_refusal_matches_reference(case: dict[str, Any]) -> None:
    """A broken receipt or snapshot fails with the reference's class, code and detail."""
    expected = case["expected"]
    with pytest.raises(ReceiptVerificationError) as caught:
        verify_and_linearize(*verification_inputs(VECTORS, case))
    assert type(caught.value) is CLASSES[expected["error_class"]]
    assert (caught.value.code, caught.value.detail) == (expected["code"], expected["detail"])


def test_error_message_is_code_and_detail() -> None:
    """str(error) is 'code: detail', as the reference's."""
    error = RebuildError("missing_parent", "call b names absent parent a")
    assert str(error) == "missing_parent: call b names absent parent a"
    assert isinstance(error, ValueError)


def test_non_receipt_is_a_type_error() -> None:
    """The receipt must be a RolloutReceipt."""
    _, snapshots = verification_inputs(VECTORS, CLEAN)
    with pytest.raises(TypeError):
        verify_and_linearize(CLEAN["receipt"], snapshots)  # type: ignore[arg-type]


def test_non_snapshot_is_a_type_error() -> None:
    """Every snapshot must be a StagedCallBaseSnapshot."""
    receipt, snapshots = verification_inputs(VECTORS, CLEAN)
    with pytest.raises(TypeError):
        verify_and_linearize(receipt, [snapshots[0], {"model_call_id": "b"}, snapshots[2]])  # type: ignore[list-item]


def test_empty_training_row_is_unreachable_behind_empty_generation() -> None:
    """Every chain call needs a generated token, so an all-carry row fails as empty_generation."""
    case = next(case for case in ERRORS if case["name"] == "empty_terminal_generation")
    assert case["expected"]["code"] == "empty_generation"


def test_row_arrays_are_read_only() -> None:
    """The linearized columns cannot be written to."""
    row = verify_and_linearize(*verification_inputs(VECTORS, CLEAN))
    with pytest.raises(ValueError, match="read-only"):
        row.token_ids[0] = 0


def test_extras_check_passes_for_the_staged_extras() -> None:
    """The chain's own extras hash to its commitments."""
    row = verify_and_linearize(*verification_inputs(VECTORS, CLEAN))
    check_extras(row, {"a": EXTRAS, "b": None, "c": None})


def test_extras_check_refuses_other_extras() -> None:
    """Extras that hash differently fail as extras_digest_mismatch."""
    row = verify_and_linearize(*verification_inputs(VECTORS, CLEAN))
    with pytest.raises(ReceiptVerificationError) as caught:
        check_extras(row, {"a": EXTRAS, "b": {}, "c": None})
    assert caught.value.code == "extras_digest_mismatch"


def test_extras_check_refuses_a_missing_call() -> None:
    """Every chain call's extras must be fetched (None when it staged none)."""
    row = verify_and_linearize(*verification_inputs(VECTORS, CLEAN))
    with pytest.raises(ReceiptVerificationError) as caught:
        check_extras(row, {"a": EXTRAS, "c": None})
    assert caught.value.code == "missing_extras"


def test_extras_check_refuses_unencodable_extras() -> None:
    """Extras that cannot be digested fail as invalid_extras."""
    row = verify_and_linearize(*verification_inputs(VECTORS, CLEAN))
    with pytest.raises(ReceiptVerificationError) as caught:
        check_extras(row, {"a": {"x": (1,)}, "b": None, "c": None})
    assert caught.value.code == "invalid_extras"


turns = st.lists(
    st.tuples(
        st.lists(st.integers(0, 2**64 - 1), max_size=6),
        st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=6),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=50, deadline=None)
@given(turns=turns)
def test_clean_chain_linearizes_to_its_concatenated_deltas(
    turns: list[tuple[list[int], list[int]]],
) -> None:
    """A clean chain's row is its deltas in order, masked carry-then-generation."""
    parent: StagedCallRecord | None = None
    prompt: list[int] = []
    staged: list[StagedCallRecord] = []
    for index, (carry, generated) in enumerate(turns):
        prompt = prompt + carry
        record = build_staged_call(
            rollout_id="r",
            model_call_id=f"c{index}",
            parent=parent,
            prompt_token_ids=prompt,
            generated_token_ids=generated,
            generated_log_probs=[-0.5] * len(generated),
            weight_version=index,
        )
        prompt = prompt + generated
        staged.append(record)
        parent = record
    receipt = RolloutReceipt(
        rollout_id="r",
        manifest=tuple(manifest_row(record) for record in staged),
        terminal_model_call_id=staged[-1].model_call_id,
        terminal_selection="heuristic",
    )
    row = verify_and_linearize(receipt, [record.base_snapshot() for record in staged])
    assert row.token_ids.tolist() == prompt
    assert row.token_mask.tolist() == [
        mask for carry, generated in turns for mask in [0.0] * len(carry) + [1.0] * len(generated)
    ]
    assert row.link_spans == tuple(
        (f"c{index}", len(carry), len(generated)) for index, (carry, generated) in enumerate(turns)
    )
