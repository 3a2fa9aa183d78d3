"""The `staged` part of a finalize answer, typed: NeMo Gym 0.7's verified row, or the error.

A rollout captured by NeMo Gym's external staging is not rebuilt into its
record: the finalizer verifies the staged calls and answers
`staged: {receipt, row, error}` (docs/staging.md#finalize-and-retire).
`Finalized.staged` is that object as a `StagedOutcome`:

- `row` (a `StagedRow`, None unless every check passed): the terminal
  chain's tokens root to terminal, `token_mask` 0.0 on carried prompt
  tokens and 1.0 on generated ones, `logprobs` 0.0 on carried tokens; per
  call its id, weight version, span and extras commitment;
- `error` (a `StagedFailure`, None for a verified row): the reference
  verifier's error class, its code (also the record's `mask_reason`) and
  detail;
- `receipt`: the receipt the finalizer built, as JSON.

Token columns are numpy arrays when numpy can be imported (the `fast`
extra): ids `uint64`, mask and log probabilities `float64`; else tuples of
ints and floats. The finalizer packs them (`{"encoding", "length",
"data"}`: base64 of little-endian `u32le`/`u64le` ids, `u8` mask, `f64le`
log probabilities) when the client asks for the compact form, which it
always does; plain lists are read too. Decoding is one C-level call per
column either way.
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from token_finalizer_client._exceptions import InvalidAnswerError

__all__ = [
    "ExtrasCommitment",
    "StagedFailure",
    "StagedOutcome",
    "StagedRow",
    "WeightVersionSpan",
    "read_staged",
]

# encoding -> (struct code, bytes per value)
_PACKED = {"u32le": ("I", 4), "u64le": ("Q", 8), "u8": ("B", 1), "f64le": ("d", 8)}
_NUMPY_TYPES = {"u32le": "<u4", "u64le": "<u8", "u8": "u1", "f64le": "<f8"}
_COLUMNS = ("token_ids", "token_mask", "logprobs")


def _numpy() -> Any:
    """numpy when it can be imported (the `fast` extra), else None."""
    try:
        import numpy
    except ImportError:
        return None
    return numpy


@dataclass(frozen=True, slots=True)
class WeightVersionSpan:
    """The policy weight version of one call's whole delta `[start, end)` of the row."""

    model_call_id: str
    start: int
    end: int
    weight_version: int


@dataclass(frozen=True, slots=True)
class ExtrasCommitment:
    """The extras digest a chain call is bound to (its fetched extras must hash to it)."""

    model_call_id: str
    extras_digest_version: int
    extras_digest: str


@dataclass(frozen=True, slots=True, eq=False)
class StagedRow:
    """One verified terminal chain, root call to terminal (NeMo Gym's `LinearizedRow`)."""

    rollout_id: str
    token_ids: Any
    token_mask: Any
    logprobs: Any
    model_call_ids: tuple[str, ...]
    prompt_len: int
    weight_versions: tuple[int, ...]
    weight_version_spans: tuple[WeightVersionSpan, ...]
    link_spans: tuple[tuple[str, int, int], ...]
    extras_commitments: tuple[ExtrasCommitment, ...]

    def to_json(self) -> dict[str, Any]:
        """The row as plain JSON (token columns as lists), as the finalizer's plain form."""
        return {
            "rollout_id": self.rollout_id,
            "token_ids": _plain(self.token_ids),
            "token_mask": _plain(self.token_mask),
            "logprobs": _plain(self.logprobs),
            "model_call_ids": list(self.model_call_ids),
            "prompt_len": self.prompt_len,
            "weight_versions": list(self.weight_versions),
            "weight_version_spans": [
                {
                    "model_call_id": span.model_call_id,
                    "start": span.start,
                    "end": span.end,
                    "weight_version": span.weight_version,
                }
                for span in self.weight_version_spans
            ],
            "link_spans": [list(span) for span in self.link_spans],
            "extras_commitments": [
                {
                    "model_call_id": item.model_call_id,
                    "extras_digest_version": item.extras_digest_version,
                    "extras_digest": item.extras_digest,
                }
                for item in self.extras_commitments
            ],
        }


@dataclass(frozen=True, slots=True)
class StagedFailure:
    """The first check a staged rollout failed, as NeMo Gym's verifier names it."""

    error_class: str  # "ReceiptVerificationError" or "RebuildError"
    code: str
    detail: str


@dataclass(frozen=True, slots=True)
class StagedOutcome:
    """A staged rollout's finalize: the receipt, and a verified row or the failure."""

    receipt: dict[str, Any] | None
    row: StagedRow | None
    error: StagedFailure | None

    def to_json(self) -> dict[str, Any]:
        """`{"receipt", "row", "error"}` as plain JSON (for storing the answer)."""
        error = self.error
        return {
            "receipt": self.receipt,
            "row": None if self.row is None else self.row.to_json(),
            "error": None
            if error is None
            else {"class": error.error_class, "code": error.code, "detail": error.detail},
        }


def _plain(column: Any) -> list[Any]:
    return list(column.tolist()) if hasattr(column, "tolist") else list(column)


def _bad(what: str) -> InvalidAnswerError:
    return InvalidAnswerError(f"the finalize answer's staged row: {what}")


def _packed(name: str, value: Mapping[str, Any], np: Any) -> Any:
    """A packed column decoded (numpy array, or tuple)."""
    encoding, length, data = value.get("encoding"), value.get("length"), value.get("data")
    if encoding not in _PACKED or not isinstance(data, str):
        raise _bad(f"`{name}` has an unknown encoding {encoding!r:.40}")
    code, width = _PACKED[encoding]
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise _bad(f"`{name}` is not base64") from None
    if type(length) is not int or len(raw) != length * width:
        raise _bad(f"`{name}` holds {len(raw)} bytes, not {length!r:.20} {encoding} values")
    if np is not None:
        array = np.frombuffer(raw, dtype=_NUMPY_TYPES[encoding])
        return array.astype(np.uint64 if name == "token_ids" else np.float64)
    values = struct.unpack(f"<{length}{code}", raw)
    return values if name == "token_ids" else tuple(map(float, values))


def _listed(name: str, value: Sequence[Any], np: Any) -> Any:
    """A plain JSON column (numpy array, or tuple), its values checked."""
    if name == "token_ids":
        if not all(type(v) is int and 0 <= v < 2**64 for v in value):
            raise _bad("`token_ids` holds something other than token ids")
        return np.asarray(value, dtype=np.uint64) if np is not None else tuple(value)
    if not all(type(v) in (int, float) for v in value):
        raise _bad(f"`{name}` holds something other than numbers")
    return np.asarray(value, dtype=np.float64) if np is not None else tuple(map(float, value))


def _column(name: str, value: Any, np: Any) -> Any:
    if isinstance(value, Mapping):
        return _packed(name, value, np)
    if isinstance(value, list):
        return _listed(name, value, np)
    raise _bad(f"`{name}` is neither a list nor a packed column")


def _row(data: Any) -> StagedRow:
    if not isinstance(data, Mapping):
        raise _bad("not an object")
    np = _numpy()
    try:
        ids, mask, logprobs = (_column(name, data[name], np) for name in _COLUMNS)
        if not len(ids) == len(mask) == len(logprobs):
            raise _bad("its token columns differ in length")
        return StagedRow(
            rollout_id=data["rollout_id"],
            token_ids=ids,
            token_mask=mask,
            logprobs=logprobs,
            model_call_ids=tuple(data["model_call_ids"]),
            prompt_len=data["prompt_len"],
            weight_versions=tuple(data["weight_versions"]),
            weight_version_spans=tuple(
                WeightVersionSpan(**span) for span in data["weight_version_spans"]
            ),
            link_spans=tuple((str(c), int(n), int(g)) for c, n, g in data["link_spans"]),
            extras_commitments=tuple(
                ExtrasCommitment(**item) for item in data["extras_commitments"]
            ),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise _bad(f"malformed ({type(exc).__name__}: {exc})") from None


def _failure(data: Any) -> StagedFailure:
    if not isinstance(data, Mapping) or not all(
        isinstance(data.get(key), str) for key in ("class", "code", "detail")
    ):
        raise InvalidAnswerError("the finalize answer's staged error is not {class, code, detail}")
    return StagedFailure(data["class"], data["code"], data["detail"])


def read_staged(value: Any) -> StagedOutcome | None:
    """The answer's `staged` object typed (None when absent or null)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidAnswerError("the finalize answer's `staged` is not an object")
    receipt, row, error = value.get("receipt"), value.get("row"), value.get("error")
    if receipt is not None and not isinstance(receipt, dict):
        raise InvalidAnswerError("the finalize answer's staged receipt is not an object")
    if (row is None) == (error is None):
        raise InvalidAnswerError("the finalize answer's `staged` needs a row or an error")
    return StagedOutcome(
        receipt=receipt,
        row=None if row is None else _row(row),
        error=None if error is None else _failure(error),
    )
