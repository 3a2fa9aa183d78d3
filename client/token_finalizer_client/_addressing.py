"""How a capture is addressed: the store id rule and the protocol v1 paths.

Both sides check every id with these functions before a path, a URL, a file
name or a key is formed from it (docs/records-and-builds.md#store-id-rule), so
a writer learns of a bad id before it sends anything and a store refuses it
with the same words. The rule today is one for rollout ids and model call ids
alike; each has its own function so that either can change on its own.
"""

from __future__ import annotations

import re

from token_finalizer_client._constants import MAX_ID_LENGTH

__all__ = [
    "CAPTURE_SEGMENT",
    "ROLLOUT_ROUTE",
    "ROLLOUT_SEGMENT",
    "InvalidIdError",
    "check_call_id",
    "check_rollout_id",
    "rollout_path",
]

# ASCII only: `str.isalnum` and `\w` would admit look-alike letters from other scripts.
_STORE_ID = re.compile(r"[A-Za-z0-9._-]+", re.ASCII)

# Model servers correlate calls to a rollout by the path segment
# `/ng-rollout/<rollout_id>/training-token-capture`; every protocol path keeps
# it, so one id string means the same rollout everywhere (docs/store-protocol.md#paths).
ROLLOUT_SEGMENT = "ng-rollout"
CAPTURE_SEGMENT = "training-token-capture"
# The route template a store server mounts the protocol's calls under.
ROLLOUT_ROUTE = f"/{ROLLOUT_SEGMENT}/{{rollout_id}}/{CAPTURE_SEGMENT}"


class InvalidIdError(ValueError):
    """An id that cannot be a store key: outside the id alphabet, `.` or `..`, or too long."""


def _store_id(value: object, what: str) -> str:
    """`value` when it is a store id, else InvalidIdError naming `what`."""
    if not isinstance(value, str) or not _STORE_ID.fullmatch(value) or value in {".", ".."}:
        shown = value
        if isinstance(value, str) and len(value) > MAX_ID_LENGTH:
            shown = f"{value[:MAX_ID_LENGTH]}..."  # a huge id is not echoed whole
        raise InvalidIdError(
            f"{what} {shown!r} must be a non-empty string of ASCII letters, digits, '.', '_' or '-'"
        )
    if len(value) > MAX_ID_LENGTH:
        raise InvalidIdError(
            f"{what} is {len(value)} characters long; at most {MAX_ID_LENGTH} are accepted"
        )
    return value


def check_rollout_id(value: object, what: str = "rollout_id") -> str:
    """`value` when it is a valid rollout id, else InvalidIdError naming `what`."""
    return _store_id(value, what)


def check_call_id(value: object, what: str = "model_call_id") -> str:
    """`value` when it is a valid model call id, else InvalidIdError naming `what`."""
    return _store_id(value, what)


def rollout_path(rollout_id: str, operation: str) -> str:
    """`/ng-rollout/{id}/training-token-capture/{operation}`, the id checked first."""
    return f"/{ROLLOUT_SEGMENT}/{check_rollout_id(rollout_id)}/{CAPTURE_SEGMENT}/{operation}"
