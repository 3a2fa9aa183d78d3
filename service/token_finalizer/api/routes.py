"""The HTTP endpoints; each one reads its input and hands it to the service layer."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Request
from starlette.responses import PlainTextResponse, Response

from token_finalizer._constants import DEFAULT_RUN_ID
from token_finalizer.api.deps import Authenticated, StateDep
from token_finalizer.api.responses import answer
from token_finalizer.api.schemas import (
    ERROR_RESPONSES,
    FINALIZE_ERROR_RESPONSES,
    FINALIZE_OPENAPI,
    READY_RESPONSES,
    RETIRE_OPENAPI,
)
from token_finalizer.service.errors import ServiceError
from token_finalizer.service.finalizing import finalize_one
from token_finalizer.service.metrics import CONTENT_TYPE_LATEST
from token_finalizer.service.readiness import readiness
from token_finalizer.service.retiring import retire_one
from token_finalizer.service.state import ServiceState
from token_finalizer.tracing import child_span
from token_finalizer.web.access_log import log_fields
from token_finalizer.web.answers import json_response
from token_finalizer.web.body import JsonBody, read_json_object

__all__ = ["router"]

router = APIRouter()


def _known(**fields: str | None) -> dict[str, str]:
    """The request-log fields a refused call got far enough to know (None: not reached)."""
    return {name: value for name, value in fields.items() if value is not None}


async def _json_body(request: Request, state: ServiceState) -> JsonBody:
    """A finalize or retire body: a JSON object, within `limits.max_body_bytes`."""
    return await read_json_object(
        request,
        limit=state.settings.limits.max_body_bytes,
        limit_name="limits.max_body_bytes",
        require_json_media_type=True,
    )


@router.post(
    "/finalize",
    dependencies=[Authenticated],
    summary="Freeze a finished rollout's capture and rebuild its response with exact tokens",
    responses=FINALIZE_ERROR_RESPONSES,
    openapi_extra=FINALIZE_OPENAPI,
)
async def finalize_endpoint(
    request: Request,
    state: StateDep,
    source: Annotated[str | None, Query(description="A configured source name.")] = None,
    tokens: Annotated[
        Literal["plain", "compact"],
        Query(
            description="`compact`: the context once in `context_token_ids`, "
            "prompts as prefix lengths into it (docs/finalizer-api.md)."
        ),
    ] = "plain",
    x_run_id: Annotated[
        str | None, Header(description="Run the mask-fraction guard counts this call in.")
    ] = None,
) -> Response:
    """POST /finalize: body = the finished record."""
    body = await _json_body(request, state)
    log = log_fields(request)
    try:
        result = await finalize_one(
            state, body.data, source, x_run_id or DEFAULT_RUN_ID, compact=tokens == "compact"
        )
    except ServiceError as refusal:
        # A finalize always names its record's rollout id (null when it has none).
        log["rollout_id"] = refusal.rollout_id
        log.update(_known(source=refusal.source, outcome=refusal.outcome))
        raise
    log.update(rollout_id=result.rollout_id, source=result.source, outcome=result.outcome)
    with child_span("encode"):  # the answer's JSON (and zstd) is a finalize's third step
        return await answer(request, result.answer, large=result.large or body.large)


@router.post(
    "/retire",
    dependencies=[Authenticated],
    summary="Retire the snapshot a finalize consumed, after the record was written durably",
    responses=ERROR_RESPONSES,
    openapi_extra=RETIRE_OPENAPI,
)
async def retire_endpoint(request: Request, state: StateDep) -> Response:
    """POST /retire: body = the finalize answer's `retire` object (or the whole answer)."""
    body = await _json_body(request, state)
    log = log_fields(request)
    try:
        result = await retire_one(state, body.data)
    except ServiceError as refusal:
        log.update(
            _known(rollout_id=refusal.rollout_id, source=refusal.source, outcome=refusal.outcome)
        )
        raise
    log.update(rollout_id=result.rollout_id, source=result.source, outcome=result.outcome)
    return await answer(request, result.answer)


@router.get("/health", summary="Liveness: 200 while the process serves")
async def health() -> Response:
    """GET /health."""
    return json_response({"status": "ok"})


@router.get(
    "/ready",
    summary="Readiness: every configured source reachable and not shutting down",
    responses=READY_RESPONSES,
)
async def ready(state: StateDep) -> Response:
    """GET /ready."""
    verdict = await readiness(state)
    return json_response(verdict.to_dict(), status_code=200 if verdict.ready else 503)


@router.get(
    "/metrics",
    summary="Prometheus metrics of this process",
    response_class=PlainTextResponse,
    responses={200: {"description": "Prometheus text exposition format."}},
)
async def metrics(state: StateDep) -> Response:
    """GET /metrics."""
    return Response(state.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})
