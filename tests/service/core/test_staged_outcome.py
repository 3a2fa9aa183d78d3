"""The staged outcome's JSON: the row's token columns as lists, arrays, or packed base64."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest

from token_finalizer.core.staged_outcome import StagedFailure, StagedOutcome, row_json
from token_finalizer.core.staging import (
    CallRecord,
    LinearizedRow,
    RebuildError,
    ReceiptVerificationError,
    RolloutReceipt,
    build_staged_call,
    verify_and_linearize,
)

ROLLOUT = "outcome"


def _row(tokens: list[int]) -> LinearizedRow:
    """A verified one-call row: `tokens` as the prompt, two generated ids after them."""
    record = build_staged_call(
        rollout_id=ROLLOUT,
        model_call_id="c1",
        parent=None,
        prompt_token_ids=tokens,
        generated_token_ids=[7, 2**33 if max(tokens) >= 2**32 else 8],
        generated_log_probs=[-0.1, -1e-300],
        weight_version=3,
    )
    row = CallRecord(
        model_call_id="c1",
        parent_call_id=None,
        prev_len=0,
        delta_len=record.delta_len,
        cum_len=record.cum_len,
        weight_version=3,
        digest=record.digest,
        extras_digest=record.extras_digest,
        staging_key=record.staging_key,
        mode="text",
        chain_hash=record.chain_hash,
        cumulative_hash=record.cumulative_hash,
        response_id="resp-1",
    )
    receipt = RolloutReceipt(
        rollout_id=ROLLOUT,
        reward=1.0,
        terminal_model_call_id="c1",
        manifest=(row,),
        terminal_selection="response_id",
    )
    return verify_and_linearize(receipt, [record.base_snapshot()])


def _decoded(column: dict[str, Any]) -> list[Any]:
    dtype = {"u32le": "<u4", "u64le": "<u8", "u8": "u1", "f64le": "<f8"}[column["encoding"]]
    values = np.frombuffer(base64.b64decode(column["data"]), dtype=dtype)
    assert len(values) == column["length"]
    return list(values.tolist())


def test_lists_are_the_rows_own_json() -> None:
    """The plain form is LinearizedRow.to_json, field for field."""
    row = _row([1, 2, 3])
    assert row_json(row, "lists") == row.to_json()


def test_arrays_hold_the_same_values_in_native_order() -> None:
    """The arrays form holds native-endian arrays of the same values (the encoder's input)."""
    row = _row([1, 2, 3])
    data = row_json(row, "arrays")
    assert [data[k].dtype.isnative for k in ("token_ids", "token_mask", "logprobs")] == [True] * 3
    plain = row.to_json()
    assert {k: data[k].tolist() for k in ("token_ids", "token_mask", "logprobs")} == {
        k: plain[k] for k in ("token_ids", "token_mask", "logprobs")
    }


def test_compact_ids_are_u32le_when_they_fit() -> None:
    """Ids below 2**32 travel as u32le and decode to the row's ids."""
    row = _row([1, 2, 2**32 - 1])
    column = row_json(row, "compact")["token_ids"]
    assert (column["encoding"], _decoded(column)) == ("u32le", row.token_ids.tolist())


def test_compact_ids_are_u64le_when_one_needs_it() -> None:
    """One id of 2**32 or more: the whole column travels as u64le, exactly."""
    row = _row([1, 2**32, 2**64 - 1])
    column = row_json(row, "compact")["token_ids"]
    assert (column["encoding"], _decoded(column)) == ("u64le", row.token_ids.tolist())


def test_compact_mask_is_u8() -> None:
    """The mask travels as one byte per token: 0 carried, 1 generated."""
    row = _row([1, 2, 3])
    column = row_json(row, "compact")["token_mask"]
    assert (column["encoding"], _decoded(column)) == ("u8", [0, 0, 0, 1, 1])


def test_compact_logprobs_are_exact_f64le() -> None:
    """Log probabilities travel as little-endian float64: every bit kept."""
    row = _row([1, 2, 3])
    column = row_json(row, "compact")["logprobs"]
    assert (column["encoding"], _decoded(column)) == ("f64le", row.logprobs.tolist())


def test_compact_leaves_the_other_fields_plain() -> None:
    """Only the three token columns are packed; spans, ids and versions stay JSON."""
    row = _row([1, 2, 3])
    packed, plain = row_json(row, "compact"), row.to_json()
    for key in ("token_ids", "token_mask", "logprobs"):
        del packed[key], plain[key]
    assert packed == plain


def test_a_failure_names_its_class() -> None:
    """A RebuildError is reported as such; any other verification error by the base class."""
    rebuild = StagedFailure.of(RebuildError("lineage_cycle", "x"))
    receipt = StagedFailure.of(ReceiptVerificationError("corrupt_digest", "y"))
    assert (rebuild.to_json()["class"], receipt.to_json()["class"]) == (
        "RebuildError",
        "ReceiptVerificationError",
    )


def test_an_outcome_is_a_row_or_an_error() -> None:
    """An outcome with both, or with neither, is refused."""
    row = _row([1, 2, 3])
    failure = StagedFailure.of(ReceiptVerificationError("corrupt_digest", "y"))
    with pytest.raises(ValueError, match="either a verified row or an error"):
        StagedOutcome(receipt=None, row=row, error=failure)
    with pytest.raises(ValueError, match="either a verified row or an error"):
        StagedOutcome(receipt=None, row=None, error=None)
