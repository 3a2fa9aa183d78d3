"""Rollout identity: the capture key derived from a finished record, and the store id checks.

Model servers put the same id into `/ng-rollout/<id>/training-token-capture`,
so the string must survive unchanged as a file name and as a URL path segment.
The id rules themselves are the wire contract's (`token_finalizer_client.protocol`,
docs/records-and-builds.md#store-id-rule), shared with every writer: any store
id may be read, inspected or deleted (`check_store_id`), but a capture is only
written under an id that also keeps NeMo Gym's rule (`check_new_store_id`), the
one finalize applies to `_ng_rollout_id`. Here their refusals become
`InvalidRolloutId`, the error every store and the finalize path handle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from token_finalizer.core.errors import InvalidRolloutId
from token_finalizer_client.protocol import (
    ROLLOUT_ID_RULE,
    InvalidIdError,
    check_call_id,
    check_new_rollout_id,
    check_rollout_id,
)

__all__ = [
    "RecordKey",
    "check_model_call_id",
    "check_new_store_id",
    "check_store_id",
    "record_key",
    "rollout_id_of",
]


def check_store_id(value: object, *, what: str = "rollout id") -> str:
    """Return `value` when it is a safe rollout store key, else raise InvalidRolloutId.

    Runs before any path or URL is built from the id, so `..`, slashes,
    percent-escapes, spaces, NUL, non-ASCII and overlong ids never reach the
    file system or a key name.
    """
    try:
        return check_rollout_id(value, what)
    except InvalidIdError as invalid:
        raise InvalidRolloutId(str(invalid)) from None


def check_new_store_id(value: object, *, what: str = "rollout id") -> str:
    """Return `value` when a capture may be written under it, else raise InvalidRolloutId.

    Every write (a call's entry, an intent, an incomplete mark, a staged call, a
    ledger row) checks this first: an id starting with `_`, `-` or `.` is a store
    id, but no finalize would ever take it (docs/records-and-builds.md#store-id-rule).
    """
    try:
        return check_new_rollout_id(value, what)
    except InvalidIdError as invalid:
        raise InvalidRolloutId(str(invalid)) from None


def check_model_call_id(value: object, *, what: str = "model_call_id") -> str:
    """Return `value` when it is a safe model call id, else raise InvalidRolloutId."""
    try:
        return check_call_id(value, what)
    except InvalidIdError as invalid:
        raise InvalidRolloutId(str(invalid)) from None


def _as_index(record: dict[str, Any], key: str) -> int:
    value = record[key]
    if isinstance(value, bool):
        raise InvalidRolloutId(f"{key} must be an integer, got {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InvalidRolloutId(f"{key} must be an integer, got {value!r}") from None


def rollout_id_of(record: object) -> str | None:
    """Derive the capture key of a finished rollout record.

    Returns None when the record names no rollout. Raises InvalidRolloutId for
    an id that is present but malformed: it is never silently rewritten.
    """
    if not isinstance(record, dict):
        return None
    explicit = record.get("_ng_rollout_id")
    if explicit is not None:
        if not isinstance(explicit, str) or not ROLLOUT_ID_RULE.fullmatch(explicit):
            # NeMo Gym 0.7's words, byte for byte: the record's error quotes them
            # (docs/records-and-builds.md#error-strings).
            raise InvalidRolloutId(
                "_ng_rollout_id must be a string of letters, digits, dots, dashes or "
                f"underscores starting with a letter or digit; got {explicit!r}"
            )
        base = explicit
    elif record.get("_ng_task_index") is not None and record.get("_ng_rollout_index") is not None:
        base = f"{record['_ng_task_index']}-{record['_ng_rollout_index']}"
    else:
        return None
    if record.get("_ng_attempt_index") is not None:
        attempt = _as_index(record, "_ng_attempt_index")
        if attempt > 0:
            base = f"{base}-a{attempt}"
    return check_store_id(base)


@dataclass(frozen=True, slots=True)
class RecordKey:
    """A record's capture key, derived once per finalize: the id (None when the record
    names none), or why the id it names is malformed."""

    rollout_id: str | None
    malformed: InvalidRolloutId | None = None


def record_key(record: object) -> RecordKey:
    """`rollout_id_of(record)`, its refusal kept as a value instead of raised."""
    try:
        return RecordKey(rollout_id_of(record))
    except InvalidRolloutId as malformed:
        return RecordKey(None, malformed)
