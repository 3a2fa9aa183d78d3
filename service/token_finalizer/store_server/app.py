"""The FastAPI app of the capture store: thin routes over a local store's methods.

Store exceptions map to statuses in one place (`_STATUS_OF`); every refusal is
`{"error": "<message>"}`. Which token may call which route is `roles.ROUTE_ROLES`.
External staging's routes are `staging_routes`; NeMo Gym's control route,
with Gym's own refusals, is `control_route`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import unquote

from fastapi import FastAPI, Request
from starlette.responses import Response
from starlette.routing import Route

from token_finalizer._constants import STORE_MAX_BODY_BYTES, STORE_RETRY_AFTER_S
from token_finalizer._prometheus import CONTENT_TYPE_LATEST
from token_finalizer.core.errors import (
    CaptureConflict,
    CaptureCorrupt,
    CaptureFrozen,
    CaptureRetired,
    InvalidRolloutId,
    SourceUnavailable,
    StoreFull,
    StoreUnreachable,
    TokenEntryError,
)
from token_finalizer.core.identity import check_model_call_id, check_new_store_id, check_store_id
from token_finalizer.sources.base import CaptureStore
from token_finalizer.store_server._answers import freeze_answer, resolve_answer
from token_finalizer.store_server._delta_put import full_body
from token_finalizer.store_server._health import store_health
from token_finalizer.store_server._known_prefix import AnsweredIds
from token_finalizer.store_server._requests import (
    call_entry,
    columns_form,
    drop_target,
    entries_form,
    is_call_path,
    known_prefix,
    optional_call_id,
    path_call_id,
    required_call_id,
    resolve_request,
    token_form,
)
from token_finalizer.store_server._route_access import route_access, route_template
from token_finalizer.store_server.capabilities import capabilities_body
from token_finalizer.store_server.control_route import install_control_route
from token_finalizer.store_server.metrics import StoreMetrics, StoreMetricsMiddleware
from token_finalizer.store_server.roles import (
    CALL_ROUTE,
    StoreTokens,
    unassigned_routes,
)
from token_finalizer.store_server.staging_routes import install_staging_routes
from token_finalizer.web.access_log import AccessLogMiddleware
from token_finalizer.web.answers import error_response, json_response
from token_finalizer.web.auth import BearerTokenGuard, Receive, Scope, Send
from token_finalizer.web.body import JsonBody, read_json_object
from token_finalizer.web.errors import HttpError, StatusTable, install_error_handlers
from token_finalizer.web.paths import ControlCharacterRefusal
from token_finalizer.web.tracing import FASTAPI_TELEMETRY, install_tracing
from token_finalizer_client.protocol import ROLLOUT_ROUTE, ROLLOUT_SEGMENT

__all__ = ["PROTOCOL_PREFIX", "create_store_app"]

PROTOCOL_PREFIX = ROLLOUT_ROUTE

# Store refusals by class; anything else is a 500 whose text stays in the log.
_STATUS_OF: StatusTable = {
    InvalidRolloutId: 422,
    TokenEntryError: 422,
    CaptureConflict: 409,
    CaptureFrozen: 409,
    CaptureRetired: 409,
    CaptureCorrupt: 500,
    StoreFull: 507,
    # Only a backend out of reach is worth another try; one that answered garbage
    # (WRONGTYPE, a script refusing its data) answers the same again: the finalizer
    # masks a 500, it retries a 503 forever (issue 29, docs/store-protocol.md).
    StoreUnreachable: 503,
    SourceUnavailable: 500,
}


def _rollout_segment(request: Request) -> str | None:
    """The rollout id as sent, before the server decoded `%2F` into a path separator."""
    raw = request.scope.get("raw_path") or request.url.path.encode()
    parts = raw.decode("latin-1").split("?", 1)[0].split("/")
    if len(parts) > 2 and parts[1] == ROLLOUT_SEGMENT:
        return unquote(parts[2])
    return None


def _bad_id_not_found(request: Request) -> Response | None:
    """`a%2Fb` arrives decoded as two segments and matches no route: name the bad id.

    (A call id holding a newline never gets here: web/paths.py refuses it 400.)
    """
    segment = _rollout_segment(request)
    if segment is not None:
        try:
            check_store_id(segment)
            if request.method == "PUT" and is_call_path(request.scope):
                check_model_call_id(path_call_id(request.scope))
        except InvalidRolloutId as invalid:
            return error_response(422, str(invalid))
        except HttpError as refusal:
            return error_response(refusal.status_code, refusal.message)
    return error_response(404, f"no such capture-store path: {request.url.path}")


async def _refuse_unknown(scope: Scope, receive: Receive, send: Send) -> None:
    """The guard's answer to a path no route serves: the same as without auth."""
    request = Request(scope, receive)
    response = _bad_id_not_found(request)
    assert response is not None
    await response(scope, receive, send)


def _check_roles(app: FastAPI) -> None:
    """Refuse to build an app serving a route whose role was never decided."""
    served = [
        (method, route.path)
        for route in app.routes
        # FastAPI's routes and the plain ones of the hot path (`_install_hot_routes`).
        if isinstance(route, Route)
        for method in route.methods or ()
    ]
    missing = unassigned_routes(served)
    if missing:
        raise RuntimeError(f"store routes without a role in ROUTE_ROLES: {', '.join(missing)}")


BodyReader = Callable[..., Awaitable[JsonBody]]


def _body_reader(max_body_bytes: int) -> BodyReader:
    """The store's one way of reading a body: an object, 422 when it is not, 413 past the limit."""

    async def read(request: Request, *, allow_empty: bool = False) -> JsonBody:
        return await read_json_object(
            request,
            limit=max_body_bytes,
            invalid_status=422,
            allow_empty=allow_empty,
            allow_non_finite=True,
        )

    return read


def _access(token: str | None, tokens: StoreTokens | None) -> StoreTokens:
    """The role tokens, with the single `token` (if any) holding every role."""
    access = tokens or StoreTokens()
    if token is None:
        return access
    return StoreTokens(
        writer=access.writer,
        finalizer=access.finalizer,
        control=access.control,
        shared=(*access.shared, token),
    )


def _app_with_guards(access: StoreTokens, metrics: StoreMetrics) -> FastAPI:
    """The bare app: the status table, the bearer check by role, the access log, metrics."""
    app = FastAPI(
        title="token-finalizer capture store",
        summary="Remote capture store, protocol v1",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        telemetry=FASTAPI_TELEMETRY,
    )
    # A store out of reach is retried within its deadline first (a Redis failover,
    # a slot move); what still fails is worth another try soon.
    install_error_handlers(
        app, _STATUS_OF, not_found=_bad_id_not_found, retry_after_s=STORE_RETRY_AFTER_S
    )
    if access.enabled:
        # Probes stay open: load balancers and the finalizer's /ready have no token.
        # The role is the one of the route that will serve the request (_route_access).
        app.add_middleware(
            BearerTokenGuard,
            tokens=access.by_role(),
            access_of=route_access(app.router.routes),
            unknown=_refuse_unknown,
        )
    # Before the guard and the router: no path with a control character is matched.
    app.add_middleware(ControlCharacterRefusal)
    # One JSON line per request, probes (/health) at debug level only.
    app.add_middleware(AccessLogMiddleware)
    # Outermost: the guard's 401s and 403s are counted with their route too,
    # labelled by the route the router serves (_route_access).
    app.add_middleware(
        StoreMetricsMiddleware, metrics=metrics, route_of=route_template(app.router.routes)
    )
    return app


def _install_probes(app: FastAPI, store: CaptureStore, metrics: StoreMetrics) -> None:
    """/health and /capabilities (open), /metrics (any configured token): docs/store-protocol.md."""

    @app.get("/health")
    async def health() -> Response:
        # The backend is pinged too: a store whose Redis is down is not healthy.
        verdict = await store_health(store)
        metrics.note_health(verdict)
        return json_response(verdict.body, status_code=verdict.status_code)

    @app.get("/capabilities")
    async def capabilities() -> Response:
        # Which extensions clients may use (docs/store-protocol.md#extensions-and-capabilities).
        return json_response(capabilities_body())

    @app.get("/metrics")
    async def metrics_text() -> Response:
        # Each scrape reads the backend's health and memory figures afresh.
        verdict = await store_health(store)
        metrics.note_health(verdict)
        return Response(metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})


def _install_capture_routes(app: FastAPI, store: CaptureStore, read: BodyReader) -> None:
    """Protocol v1's token-capture routes (docs/store-protocol.md#calls)."""

    @app.post(PROTOCOL_PREFIX + "/freeze")
    async def freeze(rollout_id: str, request: Request) -> Response:
        check_store_id(rollout_id)
        packed = columns_form(request.query_params)
        compact = entries_form(request.query_params)
        accept_encoding = request.headers.get("accept-encoding")
        return await freeze_answer(
            store, rollout_id, accept_encoding, packed_columns=packed, compact_entries=compact
        )

    @app.post(PROTOCOL_PREFIX + "/drop")
    async def drop(rollout_id: str, request: Request) -> Response:
        check_store_id(rollout_id)
        snapshot_id, version = drop_target((await read(request)).data)
        dropped = await store.drop(rollout_id, snapshot_id=snapshot_id, version=version)
        return json_response({"dropped": bool(dropped)})

    @app.post(PROTOCOL_PREFIX + "/incomplete")
    async def mark_incomplete(rollout_id: str, request: Request) -> Response:
        check_new_store_id(rollout_id)
        body = (await read(request, allow_empty=True)).data
        await store.mark_incomplete(rollout_id, optional_call_id(body))
        return json_response({"incomplete": True})

    _install_hot_routes(app, store, read)


def _install_hot_routes(app: FastAPI, store: CaptureStore, read: BodyReader) -> None:
    """The three requests a model server makes per model call: resolve, begin_call, put.

    Plain Starlette routes, not FastAPI's: these take the request whole and
    read their one path parameter themselves, so FastAPI's per-request
    dependency solving and validation (about a tenth of a millisecond of the
    server's CPU each) is skipped; middleware, the bearer check and the error
    handlers are the same as every route's (docs/architecture.md#round-trips).
    """

    answered = AnsweredIds()  # docs/store-protocol.md#known-prefix

    async def put_call(request: Request) -> Response:
        # Writes take only ids finalize can take (docs/records-and-builds.md#store-id-rule).
        rollout_id = check_new_store_id(request.path_params["rollout_id"])
        model_call_id = check_model_call_id(path_call_id(request.scope))
        body = await full_body(store, (await read(request)).data, rollout_id)
        await store.put(call_entry(body, rollout_id, model_call_id))
        return json_response({"stored": True})

    async def begin_call(request: Request) -> Response:
        rollout_id = check_new_store_id(request.path_params["rollout_id"])
        body = (await read(request)).data
        await store.begin_call(rollout_id, required_call_id(body))
        return json_response({"announced": True})

    async def resolve_lineage(request: Request) -> Response:
        rollout_id = check_store_id(request.path_params["rollout_id"])
        compact = token_form(request.query_params)
        body = (await read(request)).data
        query, known = resolve_request(body), known_prefix(body)
        accept_encoding = request.headers.get("accept-encoding")
        return await resolve_answer(
            store,
            rollout_id,
            query,
            accept_encoding,
            compact=compact,
            known=known,
            answered=answered,
        )

    app.add_route(CALL_ROUTE, put_call, methods=["PUT"])
    app.add_route(PROTOCOL_PREFIX + "/intents", begin_call, methods=["POST"])
    app.add_route(PROTOCOL_PREFIX + "/lineage/resolve", resolve_lineage, methods=["POST"])


def create_store_app(
    store: CaptureStore,
    *,
    token: str | None = None,
    tokens: StoreTokens | None = None,
    max_body_bytes: int = STORE_MAX_BODY_BYTES,
) -> FastAPI:
    """Serve protocol v1 over `store`, a local memory, file or redis store.

    The routes call its put, mark_incomplete, begin_call, freeze_lines, drop
    and resolve_lineage (read-only), and its staging methods. With `tokens`,
    every path but /health needs `Authorization: Bearer <token>` of a token
    holding the route's role (401 for an unknown token, 403 for a wrong role;
    /metrics takes any configured token); `token` is one token holding every
    role. NeMo Gym's control route is
    mounted only when a control (or shared) token is configured, and checks
    it itself. Request bodies over `max_body_bytes` are refused with 413. The
    caller owns `store` and closes it.
    """
    access = _access(token, tokens)
    metrics = StoreMetrics()
    app = _app_with_guards(access, metrics)
    read = _body_reader(max_body_bytes)
    _install_probes(app, store, metrics)
    _install_capture_routes(app, store, read)
    install_staging_routes(app, store, read)
    if access.control or access.shared:
        # Gym's control route requires a token; a finalizer may read manifests too.
        install_control_route(app, store, (*access.control, *access.finalizer, *access.shared))
    _check_roles(app)
    # Last, so the server span covers the bearer check too (docs/tracing.md).
    install_tracing(app, "token-finalizer-store")
    return app
