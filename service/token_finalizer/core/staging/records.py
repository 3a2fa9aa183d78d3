"""Staged calls: what an inference worker makes durable per model call (docs/staging.md#types).

``StagedCallRecord`` is what a worker stages (the base snapshot plus its
optional ``extras``); ``StagedCallBaseSnapshot`` is what a trainer fetches
back (no extras); ``StageResult`` is the sink's answer. Every constructor
validates exactly as NeMo Gym 0.7.0 does, the staging digest included, so an
instance always holds a self-consistent call; ``from_json`` reads the wire
form and ``to_json`` writes it (keys in the reference's field order).

Token columns are read-only numpy arrays: ids ``>u8``, masks and log
probabilities float64 (``_arrays``). Lists are accepted wherever arrays are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from token_finalizer.core.staging._arrays import FloatColumn, TokenColumn
from token_finalizer.core.staging._wire import Fields, StagingRecordError
from token_finalizer.core.staging.digests import (
    EMPTY_EXTRAS_DIGEST,
    EXTRAS_DIGEST_VERSION,
    STAGING_DIGEST_VERSION,
    STAGING_SCHEMA_VERSION,
    hash_extras,
    hash_staged_call,
    staging_key,
)

__all__ = [
    "CAPTURE_MODES",
    "SNAPSHOT_FIELDS",
    "SNAPSHOT_REQUIRED",
    "StageResult",
    "StagedCallBaseSnapshot",
    "StagedCallRecord",
    "StagingRecordError",
    "recompute_digest",
]

CAPTURE_MODES = ("token_in", "text")

# A base snapshot's wire fields and the required ones (stored.py reads stored
# snapshots against the same schema).
SNAPSHOT_FIELDS = (
    "schema_version",
    "digest_version",
    "extras_digest_version",
    "rollout_id",
    "model_call_id",
    "parent_call_id",
    "mode",
    "prev_len",
    "delta_len",
    "cum_len",
    "weight_version",
    "digest",
    "token_ids_delta",
    "token_mask_delta",
    "generation_log_probs_delta",
    "extras_digest",
    "chain_hash",
    "cumulative_hash",
)
SNAPSHOT_REQUIRED = (
    "rollout_id",
    "model_call_id",
    "mode",
    "prev_len",
    "delta_len",
    "cum_len",
    "weight_version",
    "digest",
    "token_ids_delta",
    "token_mask_delta",
    "generation_log_probs_delta",
    "chain_hash",
    "cumulative_hash",
)
_RECORD_FIELDS = (*SNAPSHOT_FIELDS, "extras")


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class StagedCallBaseSnapshot:
    """One staged call's metadata and token columns, without extras.

    Invariants: no parent <=> ``prev_len == 0`` <=> ``mode == "text"``;
    ``delta_len >= 1``; masks are 0.0 or 1.0 and a carry token (mask 0.0) has
    log probability 0.0; ``digest`` recomputes from the fields.
    """

    rollout_id: str
    model_call_id: str
    parent_call_id: str | None = None
    mode: str
    prev_len: int
    delta_len: int
    cum_len: int
    weight_version: int
    digest: str
    token_ids_delta: TokenColumn
    token_mask_delta: FloatColumn
    generation_log_probs_delta: FloatColumn
    extras_digest: str = EMPTY_EXTRAS_DIGEST
    chain_hash: str
    cumulative_hash: str
    schema_version: int = STAGING_SCHEMA_VERSION
    digest_version: int = STAGING_DIGEST_VERSION
    extras_digest_version: int = EXTRAS_DIGEST_VERSION

    def __post_init__(self) -> None:
        _validate_snapshot(self, Fields(type(self).__name__))

    def __eq__(self, other: object) -> bool:
        """Same type and same fields, columns compared by value."""
        if type(other) is not type(self):
            return NotImplemented
        return all(_same(getattr(self, name), getattr(other, name)) for name in _fields_of(self))

    @property
    def staging_key(self) -> str:
        """The default key of this call in a staging store: ``rollout_id/model_call_id``."""
        return staging_key(self.rollout_id, self.model_call_id)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StagedCallBaseSnapshot:
        """Read the wire form; any rule broken raises ``StagingRecordError``."""
        Fields(cls.__name__).keys(data, SNAPSHOT_FIELDS, SNAPSHOT_REQUIRED)
        return cls(**data)

    def to_json(self, *, native_columns: bool = False) -> dict[str, Any]:
        """The wire form (keys in field order).

        ``native_columns``: the token columns as native-endian numpy arrays
        instead of lists, for orjson's ``OPT_SERIALIZE_NUMPY``, which writes
        the same numbers without a Python object per value.
        """
        columns = _native_columns if native_columns else _list_columns
        ids, mask, log_probs = columns(self)
        return {
            "schema_version": self.schema_version,
            "digest_version": self.digest_version,
            "extras_digest_version": self.extras_digest_version,
            "rollout_id": self.rollout_id,
            "model_call_id": self.model_call_id,
            "parent_call_id": self.parent_call_id,
            "mode": self.mode,
            "prev_len": self.prev_len,
            "delta_len": self.delta_len,
            "cum_len": self.cum_len,
            "weight_version": self.weight_version,
            "digest": self.digest,
            "token_ids_delta": ids,
            "token_mask_delta": mask,
            "generation_log_probs_delta": log_probs,
            "extras_digest": self.extras_digest,
            "chain_hash": self.chain_hash,
            "cumulative_hash": self.cumulative_hash,
        }


def _list_columns(snapshot: StagedCallBaseSnapshot) -> tuple[list[Any], list[Any], list[Any]]:
    return (
        snapshot.token_ids_delta.tolist(),
        snapshot.token_mask_delta.tolist(),
        snapshot.generation_log_probs_delta.tolist(),
    )


def _native_columns(
    snapshot: StagedCallBaseSnapshot,
) -> tuple[npt.NDArray[np.uint64], FloatColumn, FloatColumn]:
    # Ids are held big-endian (``>u8``), which orjson does not write; masks and
    # log probabilities are float64 already.
    return (
        snapshot.token_ids_delta.astype(np.uint64),
        snapshot.token_mask_delta,
        snapshot.generation_log_probs_delta,
    )


def _fields_of(snapshot: StagedCallBaseSnapshot) -> tuple[str, ...]:
    return _RECORD_FIELDS if isinstance(snapshot, StagedCallRecord) else SNAPSHOT_FIELDS


def _same(first: object, second: object) -> bool:
    if isinstance(first, np.ndarray) and isinstance(second, np.ndarray):
        return bool(np.array_equal(first, second))
    return first == second


def _validate_snapshot(snapshot: StagedCallBaseSnapshot, fields: Fields) -> None:
    def normalize(name: str, value: object) -> None:
        object.__setattr__(snapshot, name, value)

    s = snapshot
    normalize(
        "schema_version",
        fields.version("schema_version", s.schema_version, STAGING_SCHEMA_VERSION),
    )
    normalize(
        "digest_version",
        fields.version("digest_version", s.digest_version, STAGING_DIGEST_VERSION),
    )
    normalize(
        "extras_digest_version",
        fields.version("extras_digest_version", s.extras_digest_version, EXTRAS_DIGEST_VERSION),
    )
    fields.identifier("rollout_id", s.rollout_id)
    fields.identifier("model_call_id", s.model_call_id)
    fields.optional_identifier("parent_call_id", s.parent_call_id)
    fields.choice("mode", s.mode, CAPTURE_MODES)
    for name in ("prev_len", "delta_len", "cum_len", "weight_version"):
        fields.count(name, getattr(s, name))
    fields.digest("digest", s.digest)
    normalize("token_ids_delta", fields.token_ids("token_ids_delta", s.token_ids_delta))
    normalize("token_mask_delta", fields.floats("token_mask_delta", s.token_mask_delta))
    normalize(
        "generation_log_probs_delta",
        fields.floats("generation_log_probs_delta", s.generation_log_probs_delta),
    )
    for name in ("extras_digest", "chain_hash", "cumulative_hash"):
        fields.digest(name, getattr(s, name))

    if s.parent_call_id is None and s.prev_len != 0:
        raise fields.fail("prev_len", "a parentless staged call must have prev_len == 0")
    if s.parent_call_id is not None and s.prev_len == 0:
        raise fields.fail("prev_len", "a child staged call must have prev_len > 0")
    if s.parent_call_id is None and s.mode != "text":
        raise fields.fail("mode", "a parentless staged call must use text mode")
    if s.parent_call_id is not None and s.mode != "token_in":
        raise fields.fail("mode", "a child staged call must use token_in mode")
    if s.delta_len == 0:
        raise fields.fail("delta_len", "a staged call delta must contain at least one token")
    try:
        actual = recompute_digest(s)
    except ValueError as error:
        raise fields.fail("digest", f"cannot be recomputed: {error}") from None
    if actual != s.digest:
        raise fields.fail("digest", "does not match the staged call's contents")


def recompute_digest(snapshot: StagedCallBaseSnapshot) -> str:
    """The staging digest of the snapshot's fields (its recorded ``extras_digest`` included)."""
    return hash_staged_call(
        schema_version=snapshot.schema_version,
        digest_version=snapshot.digest_version,
        extras_digest_version=snapshot.extras_digest_version,
        rollout_id=snapshot.rollout_id,
        model_call_id=snapshot.model_call_id,
        parent_call_id=snapshot.parent_call_id,
        mode=snapshot.mode,
        prev_len=snapshot.prev_len,
        delta_len=snapshot.delta_len,
        cum_len=snapshot.cum_len,
        weight_version=snapshot.weight_version,
        token_ids_delta=snapshot.token_ids_delta,
        token_mask_delta=snapshot.token_mask_delta,
        generation_log_probs_delta=snapshot.generation_log_probs_delta,
        extras_digest=snapshot.extras_digest,
        chain_hash=snapshot.chain_hash,
        cumulative_hash=snapshot.cumulative_hash,
    )


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class StagedCallRecord(StagedCallBaseSnapshot):
    """A staged call as the worker hands it to the sink: the base snapshot plus ``extras``.

    ``extras_digest`` must equal ``hash_extras(extras)`` (``None`` and ``{}``
    differ). The extras mapping is kept as given; treat it as read-only.
    """

    extras: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        fields = Fields(type(self).__name__)
        _validate_snapshot(self, fields)
        if self.extras is not None and not isinstance(self.extras, dict):
            kind = type(self.extras).__name__
            raise fields.fail("extras", f"must be an object or null, got {kind}")
        try:
            actual = hash_extras(self.extras)
        except (TypeError, ValueError) as error:
            raise fields.fail("extras", f"cannot be digested: {error}") from None
        if actual != self.extras_digest:
            raise fields.fail("extras_digest", "does not match extras")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StagedCallRecord:
        """Read the wire form; any rule broken raises ``StagingRecordError``."""
        Fields(cls.__name__).keys(data, _RECORD_FIELDS, SNAPSHOT_REQUIRED)
        return cls(**data)

    def to_json(self, *, native_columns: bool = False) -> dict[str, Any]:
        """The wire form: the base snapshot's keys, then ``extras`` (``native_columns``: above)."""
        base = StagedCallBaseSnapshot.to_json(self, native_columns=native_columns)
        return {**base, "extras": self.extras}

    def base_snapshot(self) -> StagedCallBaseSnapshot:
        """The same call without extras, as a staging source returns it (not re-validated)."""
        base = object.__new__(StagedCallBaseSnapshot)
        for name in SNAPSHOT_FIELDS:
            object.__setattr__(base, name, getattr(self, name))
        return base


_RESULT_FIELDS = ("schema_version", "ok", "staging_key", "error")


@dataclass(frozen=True, slots=True, kw_only=True)
class StageResult:
    """A staging sink's answer: ``ok`` with the key to fetch the call by, or an error text."""

    ok: bool
    staging_key: str | None = None
    error: str | None = None
    schema_version: int = STAGING_SCHEMA_VERSION

    def __post_init__(self) -> None:
        fields = Fields("StageResult")
        object.__setattr__(
            self,
            "schema_version",
            fields.version("schema_version", self.schema_version, STAGING_SCHEMA_VERSION),
        )
        fields.boolean("ok", self.ok)
        fields.optional_identifier("staging_key", self.staging_key)
        fields.text("error", self.error)
        if self.ok and self.staging_key is None:
            raise fields.fail("staging_key", "a successful stage result requires staging_key")
        if not self.ok and not self.error:
            raise fields.fail("error", "a failed stage result requires an error")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StageResult:
        """Read the wire form; any rule broken raises ``StagingRecordError``."""
        Fields("StageResult").keys(data, _RESULT_FIELDS, ("ok",))
        return cls(**data)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "ok": self.ok,
            "staging_key": self.staging_key,
            "error": self.error,
        }
