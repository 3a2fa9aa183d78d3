"""Protocol v1 request fields: the ids and values each call needs, checked.

Every refusal is an HttpError 422 naming what is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from token_finalizer.core.identity import check_model_call_id
from token_finalizer.core.lineage_resolution import (
    HEX_DIGEST,
    ResolutionRequestError,
    check_resolution_request,
)
from token_finalizer.sources.base import LineageQuery
from token_finalizer.web.errors import HttpError
from token_finalizer_client.protocol import CAPTURE_SEGMENT

__all__ = [
    "KnownPrefix",
    "call_entry",
    "columns_form",
    "drop_target",
    "entries_form",
    "is_call_path",
    "known_prefix",
    "optional_call_id",
    "path_call_id",
    "required_call_id",
    "resolve_request",
    "token_form",
]

# `tokens=` of a resolve request: how the match's cumulative ids are sent.
_TOKEN_FORMS = ("plain", "compact")
# `columns=` of a freeze request: how a staged snapshot's token columns are sent.
_COLUMN_FORMS = ("plain", "packed")
# `entries=` of a freeze request: a token rollout's entries as written, or as stored.
_ENTRY_FORMS = ("plain", "compact")


@dataclass(frozen=True, slots=True)
class KnownPrefix:
    """Ids a resolving client already holds: how many, and their token digest.

    docs/store-protocol.md#known-prefix: when they are a prefix of the
    match's cumulative ids, a compact answer carries only the ids after them.
    """

    length: int
    digest: str


def call_entry(body: dict[str, Any], rollout_id: str, model_call_id: str) -> dict[str, Any]:
    """The TokenEntry a PUT stores: the path names the call, the body may repeat it, not differ.

    Both ids come from the path and were checked before the body was read.
    """
    for key, from_path in (("rollout_id", rollout_id), ("model_call_id", model_call_id)):
        if key not in body:
            body[key] = from_path
        elif body[key] != from_path:
            raise HttpError(422, f"body {key} {body[key]!r} differs from the path's {from_path!r}")
    return body


_CALLS = f"/{CAPTURE_SEGMENT}/calls/".encode()


def is_call_path(scope: Mapping[str, Any]) -> bool:
    """Whether the raw path names a model call (`.../training-token-capture/calls/...`)."""
    return _CALLS in bytes(scope.get("raw_path") or b"")


def path_call_id(scope: Mapping[str, Any]) -> str:
    """The model call id of a PUT path, percent-decoded exactly once from the raw path.

    Read from the bytes as sent, not from the server's decoded path, so that
    `%2F` is a `/` of the id and `%252F` the three characters `%2F`, whatever
    the ASGI server did to the path. A sequence that is not UTF-8 is a 422.
    """
    raw = scope.get("raw_path")
    if not raw:
        return str(scope["path_params"]["model_call_id"])
    encoded = bytes(raw).split(b"?", 1)[0].split(_CALLS, 1)[-1]
    try:
        return unquote(encoded.decode("ascii"), errors="strict")
    except UnicodeDecodeError:
        raise HttpError(422, "the model call id in the path is not percent-encoded UTF-8") from None


def optional_call_id(body: dict[str, Any]) -> str:
    """`model_call_id` of an incomplete mark: absent or "" marks the rollout as a whole."""
    value = body.get("model_call_id", "")
    if value is None or value == "":
        return ""
    return check_model_call_id(value)


def required_call_id(body: dict[str, Any]) -> str:
    """`model_call_id` of an announced call."""
    if "model_call_id" not in body:
        raise HttpError(422, "model_call_id is missing")
    return check_model_call_id(body["model_call_id"])


def drop_target(body: dict[str, Any]) -> tuple[str, int]:
    """(snapshot_id, version) of a drop request."""
    snapshot_id, version = body.get("snapshot_id"), body.get("version")
    if not isinstance(snapshot_id, str) or not snapshot_id:
        raise HttpError(422, f"snapshot_id must be a non-empty string, got {snapshot_id!r}")
    if isinstance(version, bool) or not isinstance(version, int):
        raise HttpError(422, f"version must be an integer, got {version!r}")
    return snapshot_id, version


def resolve_request(body: dict[str, Any]) -> LineageQuery:
    """The checked resolve request; 422 naming the first problem (unknown keys are ignored)."""
    missing = [
        key for key in ("fingerprint_version", "fingerprint", "context_digests") if key not in body
    ]
    if missing:
        raise HttpError(422, f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing")
    digests = body["context_digests"]
    if not isinstance(digests, list):
        raise HttpError(422, f"context_digests must be a list, got {type(digests).__name__}")
    try:
        # The resolver's own rules (version, hex digests), before any entry is read.
        check_resolution_request(body["fingerprint"], body["fingerprint_version"], digests)
    except ResolutionRequestError as exc:
        raise HttpError(422, str(exc)) from None
    return LineageQuery(body["fingerprint_version"], body["fingerprint"], tuple(digests))


def known_prefix(body: dict[str, Any]) -> KnownPrefix | None:
    """The resolve request's `known` prefix, if it names one; 422 when it is malformed."""
    known = body.get("known")
    if known is None:
        return None
    length = known.get("length") if isinstance(known, dict) else None
    digest = known.get("digest") if isinstance(known, dict) else None
    if type(length) is not int or length < 0:
        raise HttpError(422, f"known.length must be an integer >= 0, got {length!r:.40}")
    if not isinstance(digest, str) or not HEX_DIGEST.fullmatch(digest):
        raise HttpError(422, f"known.digest must be 64 lowercase hex digits, got {digest!r:.80}")
    return KnownPrefix(length, digest)


def columns_form(query_params: Mapping[str, str]) -> bool:
    """Whether a freeze asks for staged token columns packed (`columns=packed`; default plain)."""
    form = query_params.get("columns", "plain")
    if form not in _COLUMN_FORMS:
        raise HttpError(422, f"columns must be one of {', '.join(_COLUMN_FORMS)}, got {form!r}")
    return form == "packed"


def entries_form(query_params: Mapping[str, str]) -> bool:
    """Whether a freeze asks for the entries as stored (`entries=compact`; default plain)."""
    form = query_params.get("entries", "plain")
    if form not in _ENTRY_FORMS:
        raise HttpError(422, f"entries must be one of {', '.join(_ENTRY_FORMS)}, got {form!r}")
    return form == "compact"


def token_form(query_params: Mapping[str, str]) -> bool:
    """Whether a resolve asks for its ids in the compact form (`tokens=compact`; default plain)."""
    form = query_params.get("tokens", "plain")
    if form not in _TOKEN_FORMS:
        raise HttpError(422, f"tokens must be one of {', '.join(_TOKEN_FORMS)}, got {form!r}")
    return form == "compact"
