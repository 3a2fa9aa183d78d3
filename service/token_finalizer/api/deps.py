"""Dependencies of the routes: the app's shared state and bearer-token auth."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from token_finalizer.service.state import ServiceState
from token_finalizer.settings import Settings
from token_finalizer.web.auth import check_bearer

__all__ = ["Authenticated", "SettingsDep", "StateDep", "require_bearer_token", "service_state"]


# Every dependency is `async def` on purpose: FastAPI runs plain `def`
# dependencies in a worker thread, and those hops (three per finalize) cut the
# small-rollout throughput of a worker by about a fifth under load.


async def service_state(request: Request) -> ServiceState:
    """The state the app's lifespan created."""
    state: ServiceState = request.app.state.service  # set by the lifespan, nowhere else
    return state


StateDep = Annotated[ServiceState, Depends(service_state)]


async def _settings(state: StateDep) -> Settings:
    return state.settings


SettingsDep = Annotated[Settings, Depends(_settings)]


async def require_bearer_token(request: Request, settings: SettingsDep) -> None:
    """Refuse with 401 unless auth is off or the request bears a configured token."""
    tokens = settings.auth.bearer_tokens
    if tokens:
        check_bearer(request.headers.get("authorization"), [token.encode() for token in tokens])


Authenticated = Depends(require_bearer_token)
