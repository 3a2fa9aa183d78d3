"""`HttpStagingSink`: where an inference worker stages each call's token delta (NeMo Gym 0.7).

In external staging the worker, not Gym, keeps the tokens: after each call
it stages one `StagedCallRecord` (and any framework attachments) and tells
Gym where it lies only once the store has made it durable. This class is
Gym's `StagingSink` over the capture store (docs/staging.md#the-client):

    sink = HttpStagingSink("http://capture-store:8100", token=WRITER_TOKEN)
    install_capture(serving_layer, sink=sink, weight_version_fn=...)  # Gym's own hook
    result = sink.stage(record, attachments={"pixels": raw})  # from any completion thread
    result.ok, result.staging_key, result.error

`stage` is synchronous and thread-safe: every completion thread of the
worker shares one pool (`_blocking_store`). It sends `PUT .../staged/{call
id}` with the record and its attachments in one body (the token columns
packed as binary images, `_packed_columns`, when the store advertises
`packed_stage`; else as lists in the record); the store answers once both
are durable. It never raises: whatever keeps the call from being
staged is `StageResult(ok=False, error=...)`, which Gym turns into a
`worker_capture_failed` row so the rollout is never trained on a hole:

- a custody check or validation the store refused (422):
  `"<check>: <message>"`, e.g. `"chain_hash_mismatch: call c2: ..."`;
- a different record already staged under the key, or a frozen or
  retired rollout (409): `"HTTP 409: <message>"`;
- an attachment that cannot be stored exactly, or a record without valid
  ids: refused before anything is sent;
- connection trouble and 502/503/504, retried by the one retry policy (a
  stage is write-once, so a repeat of the same record is a no-op), then
  the last error.

The identical record staged again answers ok. The staging key is the
store's: `rollout_id/model_call_id`, which `HttpStagingSource` fetches. The result is Gym's own
`StageResult` when Gym's staging records module is loaded (Gym's capture
refuses any other class), else this package's (`_staged_types`).

`clear(keys)` is the other half of NeMo RL's staging sink (its
`TQTokenSink.clear`): once a trainer has consumed a rollout's staged calls it
deletes exactly those, dead branches included, through the store's
`staged_clear` extension (docs/staging.md#clearing-staged-calls). It needs a
**finalizer** token (a writer token is refused, 403), so the trainer holds
its own sink for it; it is idempotent, and it raises, unlike `stage`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

from token_finalizer_client._addressing import (
    check_call_id,
    check_new_rollout_id,
    rollout_path,
    staged_path,
    staging_keys_by_rollout,
)
from token_finalizer_client._attachments import encode_attachments
from token_finalizer_client._blocking_store import BlockingStoreConnection
from token_finalizer_client._capabilities import (
    PACKED_STAGE,
    REFUSED_EXTENSION_STATUSES,
    STAGED_CLEAR,
)
from token_finalizer_client._exceptions import (
    InvalidAnswerError,
    UnsupportedFeatureError,
    shorten,
)
from token_finalizer_client._gym_types import gym_staging_class
from token_finalizer_client._json import dumps
from token_finalizer_client._packed_columns import COLUMN_NAMES, pack_columns
from token_finalizer_client._staged_types import StageResult
from token_finalizer_client._wire import WireRequest, decode_body, read_object

__all__ = ["HttpStagingSink"]

_CLEAR = "staged/clear"


def _ids(record: object) -> tuple[str, str]:
    """(rollout id, call id) of a record; ValueError or TypeError when it names none validly."""
    if isinstance(record, Mapping):
        rollout_id, call_id = record.get("rollout_id"), record.get("model_call_id")
    elif callable(getattr(record, "model_dump_json", None)):
        rollout_id = getattr(record, "rollout_id", None)
        call_id = getattr(record, "model_call_id", None)
    else:
        raise TypeError(
            f"record must be a StagedCallRecord or a mapping, got {type(record).__name__}"
        )
    return check_new_rollout_id(rollout_id), check_call_id(call_id)


def _record_body(record: object, attachments: bytes, *, pack: bool) -> tuple[bytes, bool]:
    """(the request body, whether its columns went packed) of a record `_ids` accepted.

    `attachments` are already encoded. With `pack`, the token columns go
    packed beside the record when they pack exactly (`_packed_columns`);
    else, and without it, in the record as lists.
    """
    if isinstance(record, Mapping):
        columns = pack_columns(*(record.get(name) for name in COLUMN_NAMES)) if pack else None
        if columns is None:
            record_json = dumps(dict(record))
        else:
            record_json = dumps({k: v for k, v in record.items() if k not in COLUMN_NAMES})
    else:
        # Gym's pydantic record writes its own JSON (the same values as
        # model_dump(mode="json")) in one pass; it is spliced into the body as is.
        dump_json: Any = cast(Any, record).model_dump_json
        columns = (
            pack_columns(*(getattr(record, name, None) for name in COLUMN_NAMES)) if pack else None
        )
        payload = dump_json() if columns is None else dump_json(exclude=set(COLUMN_NAMES))
        record_json = payload.encode() if isinstance(payload, str) else payload
    body = b'{"attachments":' + attachments + b',"record":' + record_json
    if columns is not None:
        body += b',"columns":' + dumps(columns)
    return body + b"}", columns is not None


def _result(*, ok: bool, staging_key: str | None = None, error: str | None = None) -> Any:
    """Gym's `StageResult` when its staging module is loaded, else this package's."""
    gym = gym_staging_class("StageResult")
    if gym is not None:
        return gym(ok=ok, staging_key=staging_key, error=error)
    return StageResult(ok=ok, staging_key=staging_key, error=error)


def _refusal(status_code: int, body: Any) -> str:
    """The error text of a refused stage: the store's check first, when it names one."""
    message = body.get("error") if isinstance(body, dict) else None
    check = body.get("check") if isinstance(body, dict) else None
    text = shorten(message) if isinstance(message, str) and message else f"status {status_code}"
    if isinstance(check, str) and check:
        # A store's message may already start with its check ("check: detail").
        return text if text.startswith(f"{check}: ") else f"{shorten(check, 100)}: {text}"
    return f"HTTP {status_code}: {text}"


class HttpStagingSink(BlockingStoreConnection):
    """NeMo Gym 0.7 `StagingSink` over a remote capture store (see the module docstring)."""

    def stage(self, record: Any, *, attachments: Mapping[str, Any] | None = None) -> Any:
        """Stage one call's record (and attachments) durably; a `StageResult`, never an exception.

        `record` is Gym's `StagedCallRecord` or its JSON form as a mapping.
        `attachments` maps names to bytes or JSON values, stored in the same
        write (or the call is refused).
        """
        try:
            # Checked before anything is sent, the store's features included.
            rollout_id, call_id = _ids(record)
            encoded = dumps(encode_attachments(attachments))
        except (TypeError, ValueError) as exc:
            return _result(ok=False, error=f"not staged: {exc}")
        path = staged_path(rollout_id, call_id)
        try:
            body, packed = _record_body(record, encoded, pack=self._supports(PACKED_STAGE))
            reply = self._call(WireRequest("PUT", path, body))
            if packed and reply.status_code in REFUSED_EXTENSION_STATUSES:
                # Perhaps no longer the store that advertised packed columns: ask it
                # again, and stage as lists once more if it no longer does (a stage
                # is write-once: the same record again is safe).
                self._forget_capabilities()
                if not self._supports(PACKED_STAGE):
                    body, _ = _record_body(record, encoded, pack=False)
                    reply = self._call(WireRequest("PUT", path, body))
        except Exception as exc:  # no answer after the retries, one too large, a closed pool
            # Gym's contract: a sink answers; whatever went wrong is a failed result.
            return _result(ok=False, error=f"{type(exc).__name__}: {shorten(str(exc))}")
        answer = decode_body(reply)
        if not reply.is_success:
            return _result(ok=False, error=_refusal(reply.status_code, answer))
        key = answer.get("staging_key") if isinstance(answer, dict) else None
        if not isinstance(answer, dict) or answer.get("ok") is not True or not key:
            shown = shorten(repr(answer), 200)
            return _result(ok=False, error=f"the store's stage answer is not an ok: {shown}")
        if key != f"{rollout_id}/{call_id}":
            return _result(ok=False, error=f"the store answered another call's key: {key!r:.200}")
        return _result(ok=True, staging_key=key)

    def clear(self, staging_keys: Iterable[str]) -> None:
        """Delete exactly the named staged calls (record, extras, attachments); idempotent.

        Keys are staging keys, `rollout_id/model_call_id`, of any rollouts
        (one request per rollout). Every key is checked before anything is
        sent: one that is not a staging key raises `ValueError` naming it. A
        key the store does not hold (never staged, or cleared already) is no
        error. Ledger rows stay, and a cleared call cannot be staged again.
        Needs a finalizer token: `PermissionDeniedError` (403) with a
        writer's; `ConflictError` (409) for a frozen rollout, whose staged
        calls go when it is retired. `UnsupportedFeatureError` when the
        store does not advertise `staged_clear` (nothing is deleted).
        """
        if isinstance(staging_keys, str | bytes):
            raise TypeError("staging_keys is a list of staging keys, not one string")
        by_rollout = staging_keys_by_rollout(staging_keys)
        if not by_rollout:
            return
        if not self._supports(STAGED_CLEAR):
            raise self._no_clear()
        for rollout_id, call_ids in by_rollout.items():
            request = WireRequest.json("POST", rollout_path(rollout_id, _CLEAR), {"keys": call_ids})
            reply = self._call(request)
            if reply.status_code in REFUSED_EXTENSION_STATUSES:
                # Perhaps no longer the store that advertised it: ask again, and say so
                # if it no longer does; else the refusal stands (a 422 names the key).
                self._forget_capabilities()
                if not self._supports(STAGED_CLEAR):
                    raise self._no_clear()
            cleared = read_object(reply).get("cleared")
            if type(cleared) is not int or not 0 <= cleared <= len(call_ids):
                raise InvalidAnswerError(
                    f"the store's clear answer for rollout {rollout_id} is not a count "
                    f"of at most {len(call_ids)}: {cleared!r:.100}"
                )

    def _no_clear(self) -> UnsupportedFeatureError:
        return UnsupportedFeatureError(
            STAGED_CLEAR,
            f"the capture store at {self.url} does not advertise {STAGED_CLEAR!r} at "
            "GET /capabilities, so it cannot delete staged calls one by one; nothing was "
            "deleted. Upgrade the store, or retire each rollout whole after finalizing it "
            "(docs/staging.md#clearing-staged-calls)",
        )
