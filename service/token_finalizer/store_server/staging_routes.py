"""External staging routes of the capture store (docs/staging.md#protocol).

Under the rollout prefix `{base}/ng-rollout/{rid}/training-token-capture/`:

    POST ledger/records              {"row"}                    201 / 200 {"recorded": bool}
    POST ledger/failures             {"model_call_id","reason"} 201 / 200 {"recorded": bool}
    GET  ledger/has-rows                                        {"has_rows": bool}
    GET  ledger/manifest                                        RolloutManifest
    PUT  staged/{call}               {"record","attachments"}   {"ok": true, "staging_key"}
    POST staged/fetch                {"keys"}                   {"snapshots": [...]}
    POST staged/extras               {"keys"}                   {"extras": [...], "missing"}
    GET  staged/{call}/attachments                              {"attachments"}, 404
    POST staged/clear                {"keys"}                   {"cleared": n}  (extension)

Each route is one call of the store's StagingStore methods; the freeze, drop
and lineage/resolve routes of protocol v1 serve staging rollouts too
(`_answers`). The role each route needs is in `roles.ROUTE_ROLES`; the routes
are added to the app itself (not through an included router), so the app's
check that every served route has a role sees them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from starlette.responses import Response

from token_finalizer._constants import STORE_ENCODE_IN_THREAD_MIN_BYTES
from token_finalizer.core.identity import check_new_store_id, check_store_id
from token_finalizer.core.staging import CustodyRefusal, StagingRecordError, staging_key
from token_finalizer.sources.base import CaptureStore
from token_finalizer.store_server._staging_requests import (
    call_keys,
    failure_request,
    ledger_row_request,
    refusal,
    stage_request,
    staged_call_id,
)
from token_finalizer.store_server.roles import ATTACHMENTS_ROUTE, CLEAR_ROUTE, STAGE_ROUTE
from token_finalizer.web.answers import encoded_response, error_response, json_response
from token_finalizer.web.body import JsonBody
from token_finalizer.web.errors import HttpError
from token_finalizer_client.protocol import ROLLOUT_ROUTE

__all__ = ["install_staging_routes"]

BodyReader = Callable[[Request], Awaitable[JsonBody]]


def _row_error(error: StagingRecordError) -> HttpError:
    return HttpError(422, f"invalid ledger row: {error}")


def _snapshots_answer(snapshots: tuple[bytes | None, ...], accept_encoding: str | None) -> Response:
    """`{"snapshots": [...]}` spliced from the stored JSON, never re-encoded."""
    pieces = [b'{"snapshots":[', b",".join(s if s is not None else b"null" for s in snapshots)]
    return encoded_response([*pieces, b"]}"], accept_encoding=accept_encoding)


def install_staging_routes(app: FastAPI, store: CaptureStore, read_body: BodyReader) -> None:
    """Serve the staging routes over `store`; `read_body` reads a bounded JSON object body."""

    @app.post(ROLLOUT_ROUTE + "/ledger/records")
    async def record_row(rollout_id: str, request: Request) -> Response:
        check_new_store_id(rollout_id)
        row = ledger_row_request((await read_body(request)).data)
        try:
            recorded = await store.record_ledger_row(rollout_id, row)
        except StagingRecordError as error:
            raise _row_error(error) from None
        return json_response({"recorded": recorded}, status_code=201 if recorded else 200)

    @app.post(ROLLOUT_ROUTE + "/ledger/failures")
    async def record_failure(rollout_id: str, request: Request) -> Response:
        check_new_store_id(rollout_id)
        call_id, reason = failure_request((await read_body(request)).data)
        try:
            recorded = await store.record_ledger_failure(rollout_id, call_id, reason)
        except StagingRecordError as error:
            raise _row_error(error) from None
        return json_response({"recorded": recorded}, status_code=201 if recorded else 200)

    @app.get(ROLLOUT_ROUTE + "/ledger/has-rows")
    async def has_rows(rollout_id: str) -> Response:
        check_store_id(rollout_id)
        return json_response({"has_rows": await store.ledger_has_rows(rollout_id)})

    @app.get(ROLLOUT_ROUTE + "/ledger/manifest")
    async def manifest(rollout_id: str, request: Request) -> Response:
        check_store_id(rollout_id)
        found = await store.ledger_manifest(rollout_id)
        return json_response(
            found.to_json(), accept_encoding=request.headers.get("accept-encoding")
        )

    @app.put(STAGE_ROUTE)
    async def stage(rollout_id: str, request: Request) -> Response:
        check_new_store_id(rollout_id)
        call_id = staged_call_id(request.scope)
        body = (await read_body(request)).data
        record, attachments = stage_request(body, rollout_id, call_id)
        try:
            await store.stage(record, attachments)
        except (CustodyRefusal, StagingRecordError) as error:
            raise refusal(error) from None
        return json_response({"ok": True, "staging_key": staging_key(rollout_id, call_id)})

    @app.post(ROLLOUT_ROUTE + "/staged/fetch")
    async def fetch(rollout_id: str, request: Request) -> Response:
        check_store_id(rollout_id)
        keys = call_keys((await read_body(request)).data)
        snapshots = await store.fetch_staged(rollout_id, keys)
        accept = request.headers.get("accept-encoding")
        if sum(len(s) for s in snapshots if s is not None) >= STORE_ENCODE_IN_THREAD_MIN_BYTES:
            return await asyncio.to_thread(_snapshots_answer, snapshots, accept)
        return _snapshots_answer(snapshots, accept)

    @app.post(ROLLOUT_ROUTE + "/staged/extras")
    async def extras(rollout_id: str, request: Request) -> Response:
        check_store_id(rollout_id)
        keys = call_keys((await read_body(request)).data)
        found = await store.fetch_extras(rollout_id, keys)
        payload = {
            "extras": [found.get(key) for key in keys],
            "missing": [key for key in keys if key not in found],
        }
        accept = request.headers.get("accept-encoding")
        return await asyncio.to_thread(json_response, payload, accept_encoding=accept)

    @app.post(CLEAR_ROUTE)
    async def clear(rollout_id: str, request: Request) -> Response:
        # The `staged_clear` extension (docs/staging.md#clearing-staged-calls): the named
        # calls' staged records go, idempotently; the ledger stays.
        check_store_id(rollout_id)
        keys = call_keys((await read_body(request)).data)
        return json_response({"cleared": await store.clear_staged(rollout_id, keys)})

    @app.get(ATTACHMENTS_ROUTE)
    async def attachments(rollout_id: str, request: Request) -> Response:
        check_store_id(rollout_id)
        call_id = staged_call_id(request.scope, attachments=True)
        found = await store.fetch_attachments(rollout_id, call_id)
        if found is None:
            return error_response(404, f"call {call_id} of rollout {rollout_id} is not staged")
        accept = request.headers.get("accept-encoding")
        return json_response({"attachments": found}, accept_encoding=accept)
