"""Rollout identity: the capture key derived from a finished record.

Model servers put the same id into `/ng-rollout/<id>/training-token-capture`,
so the string must survive unchanged as a file name and as a URL path segment.
"""

from __future__ import annotations

import re
from typing import Any

from token_finalizer._constants import MAX_ID_LENGTH
from token_finalizer.core.errors import InvalidRolloutId

__all__ = ["check_store_id", "rollout_id_of"]

# ASCII only: `str.isalnum` and `\w` would admit look-alike letters from other scripts.
_STORE_ID = re.compile(r"[A-Za-z0-9._-]+", re.ASCII)
_RECORD_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*", re.ASCII)


def check_store_id(value: object, *, what: str = "rollout id") -> str:
    """Return `value` when it is a safe store key, else raise InvalidRolloutId.

    Runs before any path or URL is built from the id, so `..`, slashes,
    percent-escapes, spaces, NUL and non-ASCII never reach the file system.
    """
    if not isinstance(value, str) or not _STORE_ID.fullmatch(value) or value in {".", ".."}:
        shown = value
        if isinstance(value, str) and len(value) > MAX_ID_LENGTH:
            shown = f"{value[:MAX_ID_LENGTH]}..."
        raise InvalidRolloutId(
            f"{what} {shown!r} must be a non-empty string of ASCII letters, digits, '.', '_' or '-'"
        )
    if len(value) > MAX_ID_LENGTH:
        # Ids become file names (with suffixes) and key names: bounded, and named in docs.
        raise InvalidRolloutId(
            f"{what} is {len(value)} characters long; at most {MAX_ID_LENGTH} are accepted"
        )
    return value


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
        if not isinstance(explicit, str) or not _RECORD_ID.fullmatch(explicit):
            raise InvalidRolloutId(
                f"_ng_rollout_id {explicit!r} must match ^[A-Za-z0-9][A-Za-z0-9._-]*$"
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
