"""How a capture is addressed: the store id rules and the protocol v1 paths.

Both sides check every id with these functions before a path, a URL, a file
name or a key is formed from it (docs/records-and-builds.md#store-id-rule), so
a writer learns of a bad id before it sends anything and a store refuses it
with the same words. The two ids have different rules: a rollout id becomes a
file name and a URL path segment as it is, so it keeps to a safe alphabet; a
model call id is whatever the engine named the call (`chatcmpl-...`,
`agent:3/call-7`), as NeMo Gym 0.7 accepts it, and is only ever stored as data
(a JSON field, a line of a call-id file, a Redis hash field) or sent
percent-encoded (`call_path`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import quote

from token_finalizer_client._constants import MAX_ID_LENGTH

__all__ = [
    "CAPTURE_SEGMENT",
    "ROLLOUT_ID_RULE",
    "ROLLOUT_ROUTE",
    "ROLLOUT_SEGMENT",
    "InvalidIdError",
    "call_path",
    "check_call_id",
    "check_new_rollout_id",
    "check_rollout_id",
    "rollout_path",
    "split_staging_key",
    "staged_path",
    "staging_keys_by_rollout",
]

# ASCII only: `str.isalnum` and `\w` would admit look-alike letters from other scripts.
_STORE_ID = re.compile(r"[A-Za-z0-9._-]+", re.ASCII)
# NeMo Gym 0.7's rollout id rule, which its finalize applies to `_ng_rollout_id`:
# a store id that also starts with a letter or digit. Writers are held to it, so
# no capture is ever stored under an id no record can name
# (docs/records-and-builds.md#store-id-rule); readers and deletes take any
# store id, so a capture written before the rule can still be inspected and removed.
ROLLOUT_ID_RULE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*", re.ASCII)
_ROLLOUT_ID_RULE_TEXT = f"^{ROLLOUT_ID_RULE.pattern}$"
# What a model call id must not hold: control characters (C0, DEL, C1), which
# would split the one-id-per-line files of the file store and forge log lines,
# and lone surrogates, which no UTF-8 encoder can write.
_CALL_ID_REFUSED = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")

# Model servers correlate calls to a rollout by the path segment
# `/ng-rollout/<rollout_id>/training-token-capture`; every protocol path keeps
# it, so one id string means the same rollout everywhere (docs/store-protocol.md#paths).
ROLLOUT_SEGMENT = "ng-rollout"
CAPTURE_SEGMENT = "training-token-capture"
# The route template a store server mounts the protocol's calls under.
ROLLOUT_ROUTE = f"/{ROLLOUT_SEGMENT}/{{rollout_id}}/{CAPTURE_SEGMENT}"


class InvalidIdError(ValueError):
    """An id that cannot be a store key: outside the id alphabet, `.` or `..`, or too long."""


def _shown(value: str) -> str:
    """`value`, cut at the id limit: a huge id is not echoed whole."""
    return f"{value[:MAX_ID_LENGTH]}..." if len(value) > MAX_ID_LENGTH else value


def _too_long(value: str, what: str) -> InvalidIdError:
    return InvalidIdError(
        f"{what} is {len(value)} characters long; at most {MAX_ID_LENGTH} are accepted"
    )


def _store_id(value: object, what: str) -> str:
    """`value` when it is a store id, else InvalidIdError naming `what`."""
    if not isinstance(value, str) or not _STORE_ID.fullmatch(value) or value in {".", ".."}:
        shown = _shown(value) if isinstance(value, str) else value
        raise InvalidIdError(
            f"{what} {shown!r} must be a non-empty string of ASCII letters, digits, '.', '_' or '-'"
        )
    if len(value) > MAX_ID_LENGTH:
        raise _too_long(value, what)
    return value


def check_rollout_id(value: object, what: str = "rollout_id") -> str:
    """`value` when it is a valid rollout id, else InvalidIdError naming `what`."""
    return _store_id(value, what)


def check_new_rollout_id(value: object, what: str = "rollout_id") -> str:
    """`value` when a capture may be written under it, else InvalidIdError naming `what`.

    A store id (`check_rollout_id`) that also keeps NeMo Gym's rule, checked by
    every writer before anything is sent or stored: under an id starting with
    `_`, `-` or `.` a capture could be written but never finalized.
    """
    rollout_id = check_rollout_id(value, what)
    if not ROLLOUT_ID_RULE.fullmatch(rollout_id):
        raise InvalidIdError(
            f"{what} {rollout_id!r} must match {_ROLLOUT_ID_RULE_TEXT} (NeMo Gym's rule: "
            "a capture under any other id could never be finalized)"
        )
    return rollout_id


def check_call_id(value: object, what: str = "model_call_id") -> str:
    """`value` when it is a valid model call id, else InvalidIdError naming `what`.

    Any non-empty string of at most MAX_ID_LENGTH characters without control
    characters or lone surrogates: colons, slashes, spaces, `%`, non-ASCII
    letters are all fine.
    """
    if not isinstance(value, str) or not value:
        raise InvalidIdError(f"{what} {value!r} must be a non-empty string")
    if len(value) > MAX_ID_LENGTH:
        raise _too_long(value, what)
    refused = _CALL_ID_REFUSED.search(value)
    if refused is not None:
        raise InvalidIdError(
            f"{what} {value!r} holds {refused.group()!r}: control characters and lone "
            "surrogates are refused"
        )
    return value


def rollout_path(rollout_id: str, operation: str) -> str:
    """`/ng-rollout/{id}/training-token-capture/{operation}`, the id checked first."""
    return f"/{ROLLOUT_SEGMENT}/{check_rollout_id(rollout_id)}/{CAPTURE_SEGMENT}/{operation}"


def _call_segment(model_call_id: str) -> str:
    """The call id as one path segment: every reserved character percent-encoded.

    `.` is unreserved, so `.` and `..` would survive `quote` and be read as dot
    segments (and removed) by URL normalization on the way: they are encoded too.
    """
    segment = quote(check_call_id(model_call_id), safe="")
    return "%2E" * len(segment) if segment in {".", ".."} else segment


def call_path(rollout_id: str, model_call_id: str) -> str:
    """`/ng-rollout/{id}/training-token-capture/calls/{call id, percent-encoded}`."""
    return rollout_path(rollout_id, f"calls/{_call_segment(model_call_id)}")


def staged_path(rollout_id: str, model_call_id: str, tail: str = "") -> str:
    """`.../training-token-capture/staged/{call id, percent-encoded}` (then `/tail`, if any)."""
    operation = f"staged/{_call_segment(model_call_id)}"
    return rollout_path(rollout_id, f"{operation}/{tail}" if tail else operation)


def split_staging_key(key: object) -> tuple[str, str]:
    """`(rollout_id, model_call_id)` of a staging key `rollout_id/model_call_id`.

    A rollout id never holds `/`, so the key splits at its first one; the
    call id may hold more. InvalidIdError for a key that is not one.
    """
    if not isinstance(key, str) or "/" not in key:
        raise InvalidIdError(f"staging key {key!r:.200} is not 'rollout_id/model_call_id'")
    rollout_id, _, model_call_id = key.partition("/")
    return check_rollout_id(rollout_id), check_call_id(model_call_id)


def staging_keys_by_rollout(keys: Iterable[object]) -> dict[str, list[str]]:
    """Each rollout's call ids, in the order the keys first name them (each id once).

    Every key is checked first (`split_staging_key`): InvalidIdError (a
    ValueError) naming the first that is not one, before anything is sent.
    """
    grouped: dict[str, dict[str, None]] = {}
    for key in keys:
        try:
            rollout_id, call_id = split_staging_key(key)
        except InvalidIdError as exc:
            if isinstance(key, str) and "/" in key:  # the message names the part: name the key
                raise InvalidIdError(f"staging key {key!r:.200} is invalid: {exc}") from None
            raise
        grouped.setdefault(rollout_id, {})[call_id] = None
    return {rollout_id: list(call_ids) for rollout_id, call_ids in grouped.items()}
