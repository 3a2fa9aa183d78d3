"""What a finalize of an externally staged rollout found: the receipt, the row, or the error.

A staged build answers `staged: {receipt, row, error}` beside the record
(docs/staging.md#finalize-and-retire): the receipt our policy built from the
frozen manifest, the verified `LinearizedRow` of the record's terminal chain
(null unless every check passed, the extras included), and the first check
that failed (null when none did), as the reference verifier names it.

The row's three token columns travel in one of three forms:

- ``lists``: plain JSON lists (the seed's dict API, the batch output);
- ``arrays``: native-endian numpy arrays, which the service's JSON encoder
  writes without making Python ints of them;
- ``compact`` (`?tokens=compact`): each column as
  `{"encoding", "length", "data"}` with `data` the standard base64 of the
  little-endian values: ids as `u32le` (or `u64le` when an id needs it),
  the mask as `u8` (its values are 0.0 and 1.0 once verified), log
  probabilities as `f64le` (exact). The client turns them back into arrays.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from token_finalizer.core.staging import (
    LinearizedRow,
    RebuildError,
    ReceiptVerificationError,
    RolloutReceipt,
)

__all__ = ["COLUMN_ENCODINGS", "RowForm", "StagedFailure", "StagedOutcome", "encode_column"]

RowForm = Literal["lists", "arrays", "compact"]

#: The encodings a compact column may carry, with the little-endian dtype of each.
COLUMN_ENCODINGS = {"u32le": "<u4", "u64le": "<u8", "u8": "u1", "f64le": "<f8"}
_U32_END = 2**32


@dataclass(frozen=True, slots=True)
class StagedFailure:
    """The first check a staged rollout failed: the reference's error class, code and detail."""

    error_class: str  # "ReceiptVerificationError" or "RebuildError"
    code: str
    detail: str

    @classmethod
    def of(cls, error: ReceiptVerificationError) -> StagedFailure:
        """The failure an exception of the verifier (or of our own staging checks) describes."""
        name = "RebuildError" if isinstance(error, RebuildError) else "ReceiptVerificationError"
        return cls(error_class=name, code=error.code, detail=error.detail)

    def __str__(self) -> str:
        return f"{self.code}: {self.detail}"

    def to_json(self) -> dict[str, str]:
        return {"class": self.error_class, "code": self.code, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class StagedOutcome:
    """One staged finalize: a verified row, or the failure (exactly one of the two).

    `receipt` is None only when the frozen manifest could not make one (two
    rows of one call id, which no store of ours writes).
    """

    receipt: RolloutReceipt | None
    row: LinearizedRow | None
    error: StagedFailure | None

    def __post_init__(self) -> None:
        if (self.row is None) == (self.error is None):
            raise ValueError("a staged outcome holds either a verified row or an error")

    def to_json(self, *, form: RowForm = "lists") -> dict[str, Any]:
        """`{"receipt", "row", "error"}` with the row's token columns in `form`."""
        return {
            "receipt": None if self.receipt is None else self.receipt.to_json(),
            "row": None if self.row is None else row_json(self.row, form),
            "error": None if self.error is None else self.error.to_json(),
        }


def row_json(row: LinearizedRow, form: RowForm) -> dict[str, Any]:
    """The row as JSON, its token columns in `form` (every other field as plain JSON)."""
    data = row.to_json() if form == "lists" else _row_fields(row)
    if form == "arrays":
        # The stored ids are big-endian (the hash layout); JSON encoders want native order.
        data["token_ids"] = np.asarray(row.token_ids, dtype=np.uint64)
        data["token_mask"] = np.asarray(row.token_mask, dtype=np.float64)
        data["logprobs"] = np.asarray(row.logprobs, dtype=np.float64)
    elif form == "compact":
        ids = row.token_ids
        wide = len(ids) > 0 and int(ids.max()) >= _U32_END
        data["token_ids"] = encode_column(ids, "u64le" if wide else "u32le")
        data["token_mask"] = encode_column(row.token_mask, "u8")
        data["logprobs"] = encode_column(row.logprobs, "f64le")
    return data


def _row_fields(row: LinearizedRow) -> dict[str, Any]:
    """Every field of the row but the token columns (filled in by the caller)."""
    return {
        "rollout_id": row.rollout_id,
        "token_ids": None,
        "token_mask": None,
        "logprobs": None,
        "model_call_ids": list(row.model_call_ids),
        "prompt_len": row.prompt_len,
        "weight_versions": list(row.weight_versions),
        "weight_version_spans": [span.to_json() for span in row.weight_version_spans],
        "link_spans": [list(span) for span in row.link_spans],
        "extras_commitments": [commitment.to_json() for commitment in row.extras_commitments],
    }


def encode_column(values: npt.NDArray[Any], encoding: str) -> dict[str, Any]:
    """One token column as `{"encoding", "length", "data"}` (base64 of the packed values)."""
    packed = np.asarray(values).astype(COLUMN_ENCODINGS[encoding], copy=False)
    return {
        "encoding": encoding,
        "length": len(packed),
        "data": base64.b64encode(packed.tobytes()).decode("ascii"),
    }
