"""NeMo Gym 0.7's control route, served by the capture store exactly as Gym serves it.

    GET /training-token-capture/control/rollouts/{rollout_id}/manifest

so Gym's own `RolloutControlClient` reads our manifests unchanged
(docs/staging.md#the-control-route):

- `Authorization` must be exactly `Bearer <token>` (the scheme's case, one
  space, nothing after the token) for a control token (a finalizer token or
  the shared `--token` is accepted too); anything else is 401 with Gym's body
  `{"detail": "missing or invalid control-plane bearer token"}`, checked
  before the id;
- an id the store refuses is 400 `{"detail": "Invalid rollout id: '<id>'"}`;
- 200: the manifest (empty lists for a rollout without rows).

Gym requires a token for this route, so the store server mounts it only when
a control token (or a shared one) is configured. Every configured token is
compared in constant time, without stopping at a match.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from token_finalizer.core.errors import InvalidRolloutId
from token_finalizer.core.identity import check_store_id
from token_finalizer.sources.base import CaptureStore
from token_finalizer.store_server.roles import CONTROL_MANIFEST_ROUTE
from token_finalizer.web.answers import json_response

__all__ = ["UNAUTHORIZED_DETAIL", "install_control_route"]

UNAUTHORIZED_DETAIL = "missing or invalid control-plane bearer token"


def _bears_one_of(header: str | None, expected: Sequence[bytes]) -> bool:
    if header is None:
        return False
    presented = header.encode("latin-1")
    found = False
    for candidate in expected:
        found |= hmac.compare_digest(presented, candidate)
    return found


def install_control_route(app: FastAPI, store: CaptureStore, tokens: Sequence[str]) -> None:
    """Serve the manifest route over `store` to a bearer of any of `tokens` (non-empty)."""
    if not tokens or not all(tokens):
        raise ValueError("the control route needs at least one non-empty token")
    expected = tuple(f"Bearer {token}".encode() for token in tokens)

    @app.get(CONTROL_MANIFEST_ROUTE)
    async def rollout_manifest(rollout_id: str, request: Request) -> Response:
        if not _bears_one_of(request.headers.get("authorization"), expected):
            return JSONResponse({"detail": UNAUTHORIZED_DETAIL}, status_code=401)
        try:
            check_store_id(rollout_id)
        except InvalidRolloutId:
            return JSONResponse({"detail": f"Invalid rollout id: {rollout_id!r}"}, status_code=400)
        manifest = await store.ledger_manifest(rollout_id)
        return json_response(manifest.to_json())
