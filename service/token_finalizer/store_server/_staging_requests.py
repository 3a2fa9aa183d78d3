"""External staging request fields: what each staging route needs, checked.

Every refusal is an HttpError 422 naming what is wrong; a stage request's
refusals also carry `check` (`invalid_record`, or the custody check that
failed) so a worker's sink can say which rule its call broke.
See docs/staging.md#protocol.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from token_finalizer._constants import STAGED_FETCH_MAX_KEYS
from token_finalizer.core.identity import check_model_call_id
from token_finalizer.core.staging import (
    CustodyRefusal,
    StagedCallRecord,
    StagingRecordError,
    admit_staged_record,
    unpack_columns,
)
from token_finalizer.web.errors import HttpError
from token_finalizer_client.protocol import CAPTURE_SEGMENT

__all__ = [
    "INVALID_RECORD",
    "call_keys",
    "failure_request",
    "ledger_row_request",
    "refusal",
    "stage_request",
    "staged_call_id",
]

INVALID_RECORD = "invalid_record"
_STAGED = f"/{CAPTURE_SEGMENT}/staged/".encode()
_ATTACHMENTS = b"/attachments"
_STAGE_KEYS = frozenset({"record", "attachments", "columns"})


def staged_call_id(scope: Mapping[str, Any], *, attachments: bool = False) -> str:
    """The model call id of a `staged/{id}` path, percent-decoded exactly once from the raw path.

    `attachments`: the path ends in `/attachments`, which is not part of the id.
    """
    raw = scope.get("raw_path")
    if not raw:
        return check_model_call_id(str(scope["path_params"]["model_call_id"]))
    encoded = bytes(raw).split(b"?", 1)[0].split(_STAGED, 1)[-1]
    if attachments:
        encoded = encoded[: -len(_ATTACHMENTS)]
    try:
        call_id = unquote(encoded.decode("ascii"), errors="strict")
    except UnicodeDecodeError:
        raise HttpError(422, "the model call id in the path is not percent-encoded UTF-8") from None
    return check_model_call_id(call_id)


def ledger_row_request(body: dict[str, Any]) -> Any:
    """The committed row of a `ledger/records` request (checked by the store)."""
    if set(body) != {"row"}:
        raise HttpError(422, 'a ledger record request is {"row": <committed ledger row>}')
    return body["row"]


def failure_request(body: dict[str, Any]) -> tuple[str, str]:
    """(model_call_id, reason) of a `ledger/failures` request."""
    if set(body) != {"model_call_id", "reason"}:
        raise HttpError(422, 'a ledger failure request is {"model_call_id": ..., "reason": ...}')
    call_id, reason = body["model_call_id"], body["reason"]
    if not isinstance(reason, str) or not reason:
        raise HttpError(422, f"reason must be a non-empty string, got {reason!r:.100}")
    return check_model_call_id(call_id), reason


def _invalid(message: str) -> HttpError:
    return HttpError(422, message, check=INVALID_RECORD)


def stage_request(
    body: dict[str, Any], rollout_id: str, model_call_id: str
) -> tuple[StagedCallRecord, Any]:
    """(the staged record, its attachments as sent) of a `PUT staged/{id}` request.

    The record must pass NeMo Gym's own validation (digests included) and name
    the path's rollout and call; every refusal is a 422 with `check`. Its
    token columns may come packed in `columns` (docs/staging.md#packed-columns).
    """
    unknown = sorted(set(body) - _STAGE_KEYS)
    if unknown or "record" not in body:
        raise _invalid(
            'a stage request is {"record": <StagedCallRecord>, "attachments": ..., '
            '"columns": <packed token columns, optional>}'
        )
    data = body["record"]
    if "columns" in body:
        try:
            data = unpack_columns(data, body["columns"])
        except StagingRecordError as error:
            raise _invalid(str(error)) from None
    try:
        record = admit_staged_record(data)
    except CustodyRefusal as refusal:
        raise HttpError(422, str(refusal), check=refusal.check) from None
    for name, from_path in (("rollout_id", rollout_id), ("model_call_id", model_call_id)):
        if getattr(record, name) != from_path:
            raise _invalid(f"record {name} {getattr(record, name)!r} differs from the path's")
    return record, body.get("attachments")


def refusal(error: StagingRecordError | CustodyRefusal) -> HttpError:
    """The 422 of a stage the store refused: a custody check, or malformed attachments."""
    check = error.check if isinstance(error, CustodyRefusal) else INVALID_RECORD
    return HttpError(422, str(error), check=check)


def call_keys(body: dict[str, Any]) -> list[str]:
    """The model call ids of a `staged/fetch` or `staged/extras` request, in order."""
    if set(body) != {"keys"} or not isinstance(body["keys"], list):
        raise HttpError(422, 'the request is {"keys": [model call id, ...]}')
    keys = body["keys"]
    if len(keys) > STAGED_FETCH_MAX_KEYS:
        raise HttpError(422, f"at most {STAGED_FETCH_MAX_KEYS} keys per request, got {len(keys)}")
    return [check_model_call_id(key) for key in keys]
