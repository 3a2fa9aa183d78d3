"""`Finalized.staged`: a staged rollout's verdict, its row typed (numpy with `fast`, or tuples)."""

from __future__ import annotations

import base64
import struct
from typing import Any

import numpy as np
import pytest

from token_finalizer_client import Finalized, InvalidAnswerError, StagedOutcome
from token_finalizer_client import _staged_row as staged_row

IDS = [5, 6, 2**32 + 1]
MASK = [0.0, 1.0, 1.0]
LOGPROBS = [0.0, -0.25, -1e-300]


def _packed(encoding: str, values: list[Any]) -> dict[str, Any]:
    code = {"u32le": "I", "u64le": "Q", "u8": "B", "f64le": "d"}[encoding]
    data = struct.pack(f"<{len(values)}{code}", *values)
    return {"encoding": encoding, "length": len(values), "data": base64.b64encode(data).decode()}


def _row(compact: bool = True) -> dict[str, Any]:
    columns: dict[str, Any] = {"token_ids": IDS, "token_mask": MASK, "logprobs": LOGPROBS}
    if compact:
        columns = {
            "token_ids": _packed("u64le", IDS),
            "token_mask": _packed("u8", [int(m) for m in MASK]),
            "logprobs": _packed("f64le", LOGPROBS),
        }
    return {
        "rollout_id": "r-1",
        **columns,
        "model_call_ids": ["c1"],
        "prompt_len": 1,
        "weight_versions": [7],
        "weight_version_spans": [
            {"model_call_id": "c1", "start": 0, "end": 3, "weight_version": 7}
        ],
        "link_spans": [["c1", 1, 2]],
        "extras_commitments": [
            {"model_call_id": "c1", "extras_digest_version": 1, "extras_digest": "a" * 64}
        ],
    }


def _answer(staged: Any) -> dict[str, Any]:
    return {
        "rollout_id": "r-1",
        "source": "local",
        "record": {"_ng_rollout_id": "r-1"},
        "build": {"builder": "staged"},
        "retirable": staged is not None and staged.get("row") is not None,
        "retire": None,
        "staged": staged,
    }


def _verified(compact: bool = True) -> dict[str, Any]:
    return {"receipt": {"rollout_id": "r-1"}, "row": _row(compact), "error": None}


@pytest.fixture
def without_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client as without the `fast` extra: numpy cannot be imported."""
    monkeypatch.setattr(staged_row, "_numpy", lambda: None)


def test_packed_columns_become_numpy_arrays() -> None:
    """With numpy: ids uint64, mask and log probabilities float64, the exact values."""
    row = Finalized.from_answer(_answer(_verified())).staged.row  # type: ignore[union-attr]
    assert row is not None
    assert (row.token_ids.dtype, row.token_mask.dtype, row.logprobs.dtype) == (
        np.uint64,
        np.float64,
        np.float64,
    )
    assert (row.token_ids.tolist(), row.token_mask.tolist(), row.logprobs.tolist()) == (
        IDS,
        MASK,
        LOGPROBS,
    )


@pytest.mark.usefixtures("without_numpy")
def test_without_numpy_columns_are_tuples() -> None:
    """Without numpy: ids a tuple of ints, mask and log probabilities tuples of floats."""
    row = Finalized.from_answer(_answer(_verified())).staged.row  # type: ignore[union-attr]
    assert row is not None
    assert (row.token_ids, row.token_mask, row.logprobs) == (
        tuple(IDS),
        tuple(MASK),
        tuple(LOGPROBS),
    )
    assert type(row.token_mask[0]) is float


def test_u32_ids_widen_to_uint64() -> None:
    """A u32le column reads as the same ids in the same uint64 array type."""
    staged = _verified()
    staged["row"]["token_ids"] = _packed("u32le", [5, 6, 7])
    row = Finalized.from_answer(_answer(staged)).staged.row  # type: ignore[union-attr]
    assert row is not None
    assert (row.token_ids.dtype, row.token_ids.tolist()) == (np.uint64, [5, 6, 7])


def test_plain_lists_read_like_packed_columns() -> None:
    """An answer in the plain form gives the same row as the packed one."""
    packed = Finalized.from_answer(_answer(_verified(compact=True))).staged
    plain = Finalized.from_answer(_answer(_verified(compact=False))).staged
    assert packed is not None and plain is not None
    assert packed.to_json() == plain.to_json()


def test_the_rest_of_the_row_is_typed() -> None:
    """Spans, link spans and commitments are typed values of the row."""
    row = Finalized.from_answer(_answer(_verified())).staged.row  # type: ignore[union-attr]
    assert row is not None
    assert (
        row.weight_version_spans[0].end,
        row.link_spans,
        row.extras_commitments[0].extras_digest,
    ) == (
        3,
        (("c1", 1, 2),),
        "a" * 64,
    )


def test_to_answer_gives_the_plain_form_back() -> None:
    """`to_answer` stores the row as plain JSON lists; reading it back gives the same row."""
    finalized = Finalized.from_answer(_answer(_verified()))
    stored = finalized.to_answer()
    assert stored["staged"] == _verified(compact=False)
    again = Finalized.from_answer(stored).staged
    assert again is not None and again.to_json() == stored["staged"]


def test_an_error_is_typed() -> None:
    """A failed rollout: no row, the error's class, code and detail."""
    error = {"class": "RebuildError", "code": "lineage_cycle", "detail": "x"}
    staged = Finalized.from_answer(_answer({"receipt": None, "row": None, "error": error})).staged
    assert isinstance(staged, StagedOutcome)
    assert (staged.row, staged.error.code if staged.error else None) == (None, "lineage_cycle")


def test_an_answer_without_staged_has_none() -> None:
    """A token-capture answer has no `staged`, and `to_answer` adds none."""
    answer = _answer(None)
    del answer["staged"]
    finalized = Finalized.from_answer(answer)
    assert (finalized.staged, "staged" in finalized.to_answer()) == (None, False)


@pytest.mark.parametrize(
    "column",
    [
        {"encoding": "u16le", "length": 3, "data": ""},
        {"encoding": "u64le", "length": 4, "data": _packed("u64le", IDS)["data"]},
        {"encoding": "u64le", "length": 3, "data": "not base64!"},
        "5,6,7",
    ],
    ids=["unknown-encoding", "wrong-length", "not-base64", "a-string"],
)
def test_a_malformed_column_is_refused(column: Any) -> None:
    """A column that does not decode to its length is an InvalidAnswerError."""
    staged = _verified()
    staged["row"]["token_ids"] = column
    with pytest.raises(InvalidAnswerError, match="staged row"):
        Finalized.from_answer(_answer(staged))


def test_columns_of_different_lengths_are_refused() -> None:
    """Ids, mask and log probabilities must be one value per token."""
    staged = _verified()
    staged["row"]["logprobs"] = _packed("f64le", [0.0])
    with pytest.raises(InvalidAnswerError, match="differ in length"):
        Finalized.from_answer(_answer(staged))


def test_a_staged_object_needs_a_row_or_an_error() -> None:
    """Neither a row nor an error (or both) is not an answer the client reads."""
    with pytest.raises(InvalidAnswerError, match="a row or an error"):
        Finalized.from_answer(_answer({"receipt": None, "row": None, "error": None}))
