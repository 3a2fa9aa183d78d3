"""Lineage resolution: which committed call a new request continues (docs/records-and-builds.md).

The request is described in its wire form: the assistant fingerprint of its
items and ``context_digests`` = [conversation_digest(items[:k]) for k in 0..n].
A committed call is a candidate when its continuation fingerprint equals the
request's and the request starts with exactly the context that call was
served with. One candidate (or several with one non-empty digest and length)
resolves; none or several different ones leave the request unresolved rather
than reuse the wrong tokens.

Resolution never raises for a broken store: a delta chain that cannot be
rebuilt, a conflicting duplicate or unfingerprintable items answer
``unresolved`` with reason ``lookup_error``. Only a malformed request (an
unknown fingerprint version, digests that are not hex SHA-256) raises
``ResolutionRequestError``, which the HTTP layer turns into a 422.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from token_finalizer.core.lineage_fields import CallView, lineage_field
from token_finalizer.core.token_digest import token_digest
from token_finalizer.core.token_ids import join_ids, same_ids
from token_finalizer_client.protocol import (
    FINGERPRINT_VERSION,
    FingerprintError,
    assistant_fingerprint,
    context_digests,
)

__all__ = [
    "HEX_DIGEST",
    "LOOKUP_ERROR",
    "MAX_DELTA_DEPTH",
    "RESOLVED",
    "ROOT",
    "UNRESOLVED",
    "Resolution",
    "ResolutionMatch",
    "ResolutionRequestError",
    "check_resolution_request",
    "cumulative_token_ids",
    "resolve_items",
    "resolve_lineage",
    "same_call_payload",
]

# More delta entries than this between a call and its full-prompt anchor is
# treated as a corrupt chain (NeMo Gym uses the same bound).
MAX_DELTA_DEPTH = 10_000

ROOT = "root"
RESOLVED = "resolved"
UNRESOLVED = "unresolved"
LOOKUP_ERROR = "lookup_error"

# What a fingerprint and a context digest look like on the wire (lowercase hex SHA-256).
HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_HEX_DIGESTS = re.compile(r"[0-9a-f]*")
_DIGEST_LENGTH = 64


class ResolutionRequestError(ValueError):
    """The resolve request itself is malformed (answered 422, not resolved)."""


class _BrokenLineage(Exception):
    """The committed entries cannot answer this request (-> ``lookup_error``)."""


@dataclass(frozen=True)
class ResolutionMatch:
    """The continued call: its full cumulative token ids, digest and length."""

    model_call_id: str
    cumulative_token_ids: npt.NDArray[np.integer[Any]]
    digest: str
    prev_len: int


@dataclass(frozen=True)
class Resolution:
    """``root`` / ``resolved`` / ``unresolved``, the resolver's reason, and the match."""

    status: str
    reason: str
    match: ResolutionMatch | None


def resolve_items(entries: Sequence[CallView], request_items: Sequence[Any]) -> Resolution:
    """Resolve a request given as items (fingerprint and digests are computed here)."""
    try:
        fingerprint = assistant_fingerprint(request_items)
        if not fingerprint:
            return Resolution(ROOT, "", None)
        digests = context_digests(request_items)
    except FingerprintError:
        return Resolution(UNRESOLVED, LOOKUP_ERROR, None)
    return resolve_lineage(entries, fingerprint, FINGERPRINT_VERSION, digests)


def resolve_lineage(
    entries: Sequence[CallView],
    fingerprint: str,
    fingerprint_version: int,
    context_digests: Sequence[str],
) -> Resolution:
    """Resolve a request given in wire form over a rollout's committed entries."""
    check_resolution_request(fingerprint, fingerprint_version, context_digests)
    if not fingerprint:
        return Resolution(ROOT, "", None)
    try:
        return _resolve(entries, fingerprint, context_digests)
    except Exception:
        # _BrokenLineage in the expected cases; anything else is a malformed
        # entry, and a resolver must answer rather than fail the request.
        return Resolution(UNRESOLVED, LOOKUP_ERROR, None)


def cumulative_token_ids(
    entry: CallView, by_call_id: Mapping[str, CallView]
) -> npt.NDArray[np.integer[Any]]:
    """The call's full prompt + generation, rebuilding a delta prompt from its parents.

    Raises ``ValueError`` for a missing parent, a cycle, or more than
    ``MAX_DELTA_DEPTH`` delta entries before a full-prompt anchor. The depth is
    counted from this entry, so the answer does not depend on which entries
    were rebuilt before.
    """
    deltas: list[CallView] = []
    visited: set[str] = set()
    current = entry
    while lineage_field(current, "prompt_is_delta"):
        if current.model_call_id in visited:
            raise ValueError(f"delta chain of {entry.model_call_id} has a cycle")
        if len(deltas) == MAX_DELTA_DEPTH:
            raise ValueError(
                f"delta chain of {entry.model_call_id} exceeds {MAX_DELTA_DEPTH} entries"
            )
        visited.add(current.model_call_id)
        deltas.append(current)
        parent_id = lineage_field(current, "parent_call_id")
        parent = by_call_id.get(parent_id) if parent_id else None
        if parent is None:
            raise ValueError(f"delta entry {current.model_call_id} has no parent {parent_id!r}")
        current = parent
    pieces = [current.prompt_token_ids, current.generation_token_ids]
    for delta in reversed(deltas):
        pieces += [delta.prompt_token_ids, delta.generation_token_ids]
    # Exact whatever the pieces' dtypes (int32 and uint64 would make floats).
    return join_ids([np.asarray(piece) for piece in pieces])


def _resolve(entries: Sequence[CallView], fingerprint: str, digests: Sequence[str]) -> Resolution:
    by_call_id = _unique_by_call_id(entries)
    candidates = [entry for entry in by_call_id.values() if _continues(entry, fingerprint, digests)]
    if len(candidates) > 1 and _interchangeable(candidates, by_call_id):
        candidates = [min(candidates, key=lambda entry: entry.model_call_id)]
    if not candidates:
        return Resolution(UNRESOLVED, "no_match", None)
    if len(candidates) > 1:
        return Resolution(UNRESOLVED, "ambiguous", None)
    return Resolution(RESOLVED, "", _match(candidates[0], by_call_id))


def _continues(entry: CallView, fingerprint: str, digests: Sequence[str]) -> bool:
    """Whether the request continues ``entry``: same fingerprint, same starting context."""
    if lineage_field(entry, "continuation_fingerprint") != fingerprint:
        return False
    if lineage_field(entry, "fingerprint_version") not in (None, FINGERPRINT_VERSION):
        return False
    context_digest = lineage_field(entry, "continuation_context_digest")
    context_len = lineage_field(entry, "continuation_context_len") or 0
    # No recorded context digest: nothing proves the context, so never match.
    if not context_digest or not isinstance(context_len, int):
        return False
    return 0 <= context_len < len(digests) and digests[context_len] == context_digest


def _interchangeable(candidates: list[CallView], by_call_id: dict[str, CallView]) -> bool:
    """Whether all candidates name one cumulative sequence by the same non-empty digest."""
    first_digest = lineage_field(candidates[0], "digest")
    if not first_digest:
        return False
    if any(lineage_field(other, "digest") != first_digest for other in candidates[1:]):
        return False
    return len({_cumulative_length(entry, by_call_id) for entry in candidates}) == 1


def _match(entry: CallView, by_call_id: dict[str, CallView]) -> ResolutionMatch:
    try:
        tokens = cumulative_token_ids(entry, by_call_id)
        digest = lineage_field(entry, "digest") or ""
        if digest and token_digest(tokens) != digest:
            raise _BrokenLineage(f"rebuilt tokens of {entry.model_call_id} fail their digest")
    except ValueError as error:
        raise _BrokenLineage(str(error)) from error
    cum_len = lineage_field(entry, "cum_len")
    if cum_len is not None and cum_len != len(tokens):
        # A child would cut its prompt at prev_len; a wrong length would corrupt it.
        raise _BrokenLineage(f"cum_len of {entry.model_call_id} is not its sequence length")
    return ResolutionMatch(entry.model_call_id, tokens, digest, len(tokens))


def _cumulative_length(entry: CallView, by_call_id: dict[str, CallView]) -> int:
    cum_len = lineage_field(entry, "cum_len")
    if cum_len is not None:
        return int(cum_len)
    if not lineage_field(entry, "prompt_is_delta"):
        return len(entry.prompt_token_ids) + len(entry.generation_token_ids)
    try:
        return len(cumulative_token_ids(entry, by_call_id))
    except ValueError as error:
        raise _BrokenLineage(str(error)) from error


def _unique_by_call_id(entries: Sequence[CallView]) -> dict[str, CallView]:
    """Entries by call id, in commit order; a repeat must be an exact copy of the first."""
    by_call_id: dict[str, CallView] = {}
    for entry in entries:
        first = by_call_id.setdefault(entry.model_call_id, entry)
        if first is not entry and not same_call_payload(first, entry):
            raise _BrokenLineage(f"call {entry.model_call_id} holds two different payloads")
    return by_call_id


_LINEAGE_FIELDS = (
    "parent_call_id",
    "prompt_is_delta",
    "digest",
    "cum_len",
    "continuation_fingerprint",
    "continuation_context_len",
    "continuation_context_digest",
    "fingerprint_version",
)


def same_call_payload(first: CallView, repeat: CallView) -> bool:
    """Whether a repeat of a call id holds what its first copy holds (lineage and tokens)."""
    return (
        all(lineage_field(first, name) == lineage_field(repeat, name) for name in _LINEAGE_FIELDS)
        and same_ids(np.asarray(first.prompt_token_ids), np.asarray(repeat.prompt_token_ids))
        and same_ids(
            np.asarray(first.generation_token_ids), np.asarray(repeat.generation_token_ids)
        )
    )


def check_resolution_request(fingerprint: str, version: int, digests: Sequence[str]) -> None:
    """ResolutionRequestError unless the request is well formed (its version, its hex digests)."""
    if isinstance(version, bool) or version != FINGERPRINT_VERSION:
        raise ResolutionRequestError(
            f"unsupported fingerprint_version {version!r}, expected {FINGERPRINT_VERSION}"
        )
    if not isinstance(fingerprint, str) or (fingerprint and not HEX_DIGEST.fullmatch(fingerprint)):
        raise ResolutionRequestError('fingerprint must be "" or 64 lowercase hex digits')
    if isinstance(digests, str | bytes) or not digests:
        raise ResolutionRequestError("context_digests must be a non-empty list")
    # One match over all digests at once: a request carries one per prefix of its items.
    if not all(isinstance(digest, str) for digest in digests) or not _HEX_DIGESTS.fullmatch(
        "".join(digests)
    ):
        raise ResolutionRequestError("every context digest must be 64 lowercase hex digits")
    if any(len(digest) != _DIGEST_LENGTH for digest in digests):
        raise ResolutionRequestError("every context digest must be 64 lowercase hex digits")
