"""The FastAPI app of the capture store: thin routes over a local store's methods.

Store exceptions map to statuses in one place (`_STATUS_OF`); every refusal is
`{"error": "<message>"}`.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import unquote

from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from token_finalizer._constants import STORE_MAX_BODY_BYTES
from token_finalizer._web import error_response, json_response
from token_finalizer.errors import (
    CaptureConflict,
    CaptureCorrupt,
    CaptureError,
    CaptureFrozen,
    CaptureRetired,
    InvalidRolloutId,
    SourceUnavailable,
    TokenEntryError,
)
from token_finalizer.identity import check_store_id
from token_finalizer.store_server._answers import freeze_answer
from token_finalizer.store_server._auth import BearerTokenGuard
from token_finalizer.store_server._requests import (
    RequestRefusedError,
    call_entry,
    drop_target,
    optional_call_id,
    read_object,
    required_call_id,
)

__all__ = ["PROTOCOL_PREFIX", "create_store_app"]

logger = logging.getLogger(__name__)

PROTOCOL_PREFIX = "/ng-rollout/{rollout_id}/training-token-capture"

_STATUS_OF: tuple[tuple[type[CaptureError], int], ...] = (
    (InvalidRolloutId, 422),
    (TokenEntryError, 422),
    (CaptureConflict, 409),
    (CaptureFrozen, 409),
    (CaptureRetired, 409),
    (CaptureCorrupt, 500),
    (SourceUnavailable, 503),
)


def _capture_error(request: Request, exc: Exception) -> Response:
    status = next((code for cls, code in _STATUS_OF if isinstance(exc, cls)), 500)
    if status >= 500:
        logger.error("%s %s failed: %s", request.method, request.url.path, exc)
    return error_response(status, str(exc))


def _bad_request(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestRefusedError)
    return error_response(exc.status_code, exc.message)


def _rollout_segment(request: Request) -> str | None:
    """The rollout id as sent, before the server decoded `%2F` into a path separator."""
    raw = request.scope.get("raw_path") or request.url.path.encode()
    parts = raw.decode("latin-1").split("?", 1)[0].split("/")
    if len(parts) > 2 and parts[1] == "ng-rollout":
        return unquote(parts[2])
    return None


def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 404:
        # `a%2Fb` arrives decoded as two segments and matches no route: name the
        # bad id instead of a bare "not found".
        segment = _rollout_segment(request)
        if segment is not None:
            try:
                check_store_id(segment)
            except InvalidRolloutId as invalid:
                return error_response(422, str(invalid))
        return error_response(404, f"no such capture-store path: {request.url.path}")
    if exc.status_code == 405:
        return error_response(405, f"method {request.method} is not allowed on {request.url.path}")
    return error_response(exc.status_code, str(exc.detail))


def _unexpected(request: Request, exc: Exception) -> Response:
    logger.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response(500, f"internal error: {type(exc).__name__}: {exc}")


def create_store_app(
    store: Any, *, token: str | None = None, max_body_bytes: int = STORE_MAX_BODY_BYTES
) -> FastAPI:
    """Serve protocol v1 over `store` (put, mark_incomplete, begin_call, freeze, drop).

    With `token`, every path but /health needs `Authorization: Bearer <token>`.
    Request bodies over `max_body_bytes` are refused with 413. The caller owns
    `store` and closes it.
    """
    app = FastAPI(
        title="token-finalizer capture store",
        summary="Remote capture store, protocol v1",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.add_exception_handler(CaptureError, _capture_error)
    app.add_exception_handler(RequestRefusedError, _bad_request)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
    if token is not None:
        app.add_middleware(BearerTokenGuard, token=token)

    @app.get("/health")
    async def health() -> Response:
        return json_response({"status": "ok"})

    @app.post(PROTOCOL_PREFIX + "/freeze")
    async def freeze(rollout_id: str, request: Request) -> Response:
        check_store_id(rollout_id)
        return await freeze_answer(store, rollout_id, request.headers.get("accept-encoding"))

    @app.post(PROTOCOL_PREFIX + "/drop")
    async def drop(rollout_id: str, request: Request) -> Response:
        check_store_id(rollout_id)
        body = await read_object(request, limit=max_body_bytes)
        snapshot_id, version = drop_target(body)
        dropped = await store.drop(rollout_id, snapshot_id=snapshot_id, version=version)
        return json_response({"dropped": bool(dropped)})

    @app.put(PROTOCOL_PREFIX + "/calls/{model_call_id}")
    async def put_call(rollout_id: str, model_call_id: str, request: Request) -> Response:
        check_store_id(rollout_id)
        check_store_id(model_call_id, what="model_call_id")
        body = await read_object(request, limit=max_body_bytes)
        await store.put(call_entry(body, rollout_id, model_call_id))
        return json_response({"stored": True})

    @app.post(PROTOCOL_PREFIX + "/incomplete")
    async def mark_incomplete(rollout_id: str, request: Request) -> Response:
        check_store_id(rollout_id)
        body = await read_object(request, limit=max_body_bytes, allow_empty=True)
        await store.mark_incomplete(rollout_id, optional_call_id(body))
        return json_response({"incomplete": True})

    @app.post(PROTOCOL_PREFIX + "/intents")
    async def begin_call(rollout_id: str, request: Request) -> Response:
        check_store_id(rollout_id)
        body = await read_object(request, limit=max_body_bytes)
        await store.begin_call(rollout_id, required_call_id(body))
        return json_response({"announced": True})

    return app
