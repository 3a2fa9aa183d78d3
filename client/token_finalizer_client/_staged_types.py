"""Staging types handed out when NeMo Gym is absent: `StageResult`, `StagedCallBaseSnapshot`.

A staging sink answers `StageResult`s and a staging source hands out
`StagedCallBaseSnapshot`s. NeMo Gym's capture code and verifier check that
these are *its* classes (pydantic models), so the sink and the source use
Gym's own whenever it is in the process (`_gym_types`). A trainer without
Gym gets these frozen dataclasses instead: the same field names, the same
rules (docs/staging.md#types), token columns as tuples. They are never a
proof of integrity: the client recomputes no digest (the verifier does).

`snapshot_from_json` reads a base snapshot's wire form into this class, and
refuses what Gym's model would refuse for its shape (unknown keys, a missing
field, a boolean where a number belongs, a fractional int, a non-finite
float, an empty id, a malformed digest, columns whose lengths are not
`delta_len`), raising `ValueError` naming the field.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

__all__ = [
    "EMPTY_EXTRAS_DIGEST",
    "StageResult",
    "StagedCallBaseSnapshot",
    "snapshot_from_json",
]

# The extras digest of a call that staged no extras (NeMo Gym's constant).
EMPTY_EXTRAS_DIGEST = "a1edc33c107616cf344faf0103daa025cfb125f8e1c784ae5f6a49faf2b768b6"
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_MODES = ("token_in", "text")
_VERSIONS = {"schema_version": 2, "digest_version": 2, "extras_digest_version": 1}


@dataclass(frozen=True, slots=True)
class StageResult:
    """Whether a staged call is durable: `ok` with its `staging_key`, or not with an `error`."""

    ok: bool
    staging_key: str | None = None
    error: str | None = None
    schema_version: int = 2

    def __post_init__(self) -> None:
        if type(self.ok) is not bool:
            raise ValueError(f"ok must be a bool, got {type(self.ok).__name__}")
        if self.ok and not self.staging_key:
            raise ValueError("a successful stage result needs a staging_key")
        if not self.ok and not self.error:
            raise ValueError("a failed stage result needs an error")


@dataclass(frozen=True, slots=True, kw_only=True)
class StagedCallBaseSnapshot:
    """One staged call's metadata and token columns, without its extras (Gym's field names).

    Invariants: no parent <=> `prev_len == 0` <=> `mode == "text"`;
    `delta_len >= 1` and `cum_len == prev_len + delta_len`; each column
    holds `delta_len` values; masks are 0.0 or 1.0.
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
    token_ids_delta: tuple[int, ...]
    token_mask_delta: tuple[float, ...]
    generation_log_probs_delta: tuple[float, ...]
    extras_digest: str = EMPTY_EXTRAS_DIGEST
    chain_hash: str
    cumulative_hash: str
    schema_version: int = 2
    digest_version: int = 2
    extras_digest_version: int = 1

    def __post_init__(self) -> None:
        _check_snapshot(self)

    @property
    def staging_key(self) -> str:
        """The call's key in a staging store: `rollout_id/model_call_id`."""
        return f"{self.rollout_id}/{self.model_call_id}"

    def to_json(self) -> dict[str, Any]:
        """The wire form: Gym's `model_dump(mode="json")` of the same snapshot."""
        data = {field.name: getattr(self, field.name) for field in fields(self)}
        for column in ("token_ids_delta", "token_mask_delta", "generation_log_probs_delta"):
            data[column] = list(data[column])
        return data


_FIELD_NAMES = frozenset(field.name for field in fields(StagedCallBaseSnapshot))
_OPTIONAL = frozenset(
    {"parent_call_id", "extras_digest", "schema_version", "digest_version", "extras_digest_version"}
)


def _fail(field: str, problem: str) -> ValueError:
    return ValueError(f"StagedCallBaseSnapshot.{field}: {problem}")


def _identifier(name: str, value: object) -> None:
    if type(value) is not str or not value:
        raise _fail(name, f"must be a non-empty string, got {value!r:.80}")


def _count(name: str, value: object) -> None:
    if type(value) is not int or value < 0:
        raise _fail(name, f"must be an integer >= 0, got {value!r:.80}")


def _token_ids(value: object) -> tuple[int, ...]:
    if isinstance(value, list | tuple) and set(map(type, value)) <= {int}:
        ids: tuple[int, ...] = tuple(value)
        if min(ids, default=0) >= 0:
            return ids
    raise _fail("token_ids_delta", "must be a list of integers >= 0")


def _floats(name: str, value: object) -> tuple[float, ...]:
    # Numbers only, never booleans; a JSON 0 is 0.0. Checked per column, in C.
    if isinstance(value, list | tuple) and set(map(type, value)) <= {int, float}:
        column = tuple(map(float, value))
        if math.isfinite(sum(column)) or all(map(math.isfinite, column)):
            return column
    raise _fail(name, "must be a list of finite numbers")


def _check_snapshot(snapshot: StagedCallBaseSnapshot) -> None:
    def put(name: str, value: object) -> None:
        object.__setattr__(snapshot, name, value)

    s = snapshot
    for name, version in _VERSIONS.items():
        if getattr(s, name) != version or type(getattr(s, name)) is bool:
            raise _fail(name, f"must be {version}")
    _identifier("rollout_id", s.rollout_id)
    _identifier("model_call_id", s.model_call_id)
    if s.parent_call_id is not None:
        _identifier("parent_call_id", s.parent_call_id)
    if s.mode not in _MODES:
        raise _fail("mode", f"must be one of {', '.join(_MODES)}, got {s.mode!r:.80}")
    for name in ("prev_len", "delta_len", "cum_len", "weight_version"):
        _count(name, getattr(s, name))
    for name in ("digest", "extras_digest", "chain_hash", "cumulative_hash"):
        value = getattr(s, name)
        if type(value) is not str or not _HEX_DIGEST.fullmatch(value):
            raise _fail(name, "must be 64 lowercase hex characters")
    put("token_ids_delta", _token_ids(s.token_ids_delta))
    put("token_mask_delta", _floats("token_mask_delta", s.token_mask_delta))
    log_probs = _floats("generation_log_probs_delta", s.generation_log_probs_delta)
    put("generation_log_probs_delta", log_probs)
    if (s.parent_call_id is None) != (s.prev_len == 0):
        raise _fail("prev_len", "a call has a parent exactly when prev_len > 0")
    if (s.parent_call_id is None) != (s.mode == "text"):
        raise _fail("mode", "a call has a parent exactly when its mode is token_in")
    if s.delta_len == 0 or s.cum_len != s.prev_len + s.delta_len:
        raise _fail("delta_len", "must be >= 1, with cum_len == prev_len + delta_len")
    columns = (s.token_ids_delta, s.token_mask_delta, s.generation_log_probs_delta)
    if any(len(column) != s.delta_len for column in columns):
        raise _fail("delta_len", "every token column must hold delta_len values")
    if not set(s.token_mask_delta) <= {0.0, 1.0}:
        raise _fail("token_mask_delta", "must hold only 0.0 and 1.0")
    # The log probabilities of carried tokens (mask 0.0), all 0.0: found without a Python loop.
    carried = map((0.0).__eq__, s.token_mask_delta)
    if any(itertools.compress(s.generation_log_probs_delta, carried)):
        raise _fail("generation_log_probs_delta", "a carried token's log probability must be 0.0")


def snapshot_from_json(data: object) -> StagedCallBaseSnapshot:
    """A base snapshot's wire form as this package's type; ValueError naming a broken rule."""
    if not isinstance(data, Mapping):
        raise _fail("*", f"must be a JSON object, got {type(data).__name__}")
    unknown = [str(key) for key in data if key not in _FIELD_NAMES]
    if unknown:
        raise _fail(unknown[0], "unknown field (extra fields are not permitted)")
    missing = [name for name in _FIELD_NAMES - _OPTIONAL if name not in data]
    if missing:
        raise _fail(sorted(missing)[0], "field required")
    return StagedCallBaseSnapshot(**data)
