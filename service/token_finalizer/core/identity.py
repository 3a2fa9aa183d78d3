"""Rollout identity: the capture key derived from a finished record, and the store id checks.

Model servers put the same id into `/ng-rollout/<id>/training-token-capture`,
so the string must survive unchanged as a file name and as a URL path segment.
The id rule itself is the wire contract's (`token_finalizer_client.protocol`,
docs/records-and-builds.md#store-id-rule), shared with every writer; here its
refusals become `InvalidRolloutId`, the error every store and the finalize
path handle.
"""

from __future__ import annotations

from typing import Any

from token_finalizer.core.errors import InvalidRolloutId
from token_finalizer_client.protocol import InvalidIdError, check_call_id, check_rollout_id

__all__ = ["check_model_call_id", "check_store_id", "rollout_id_of"]


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
    an id that is present but malformed: it is never silently rewritten. An
    explicit id follows the store id rule every writer checks (NeMo Gym 0.7's
    too), so whatever a writer captured under can be finalized
    (docs/records-and-builds.md#store-id-rule).
    """
    if not isinstance(record, dict):
        return None
    explicit = record.get("_ng_rollout_id")
    if explicit is not None:
        base = check_store_id(explicit, what="_ng_rollout_id")
    elif record.get("_ng_task_index") is not None and record.get("_ng_rollout_index") is not None:
        base = f"{record['_ng_task_index']}-{record['_ng_rollout_index']}"
    else:
        return None
    if record.get("_ng_attempt_index") is not None:
        attempt = _as_index(record, "_ng_attempt_index")
        if attempt > 0:
            base = f"{base}-a{attempt}"
    return check_store_id(base)
