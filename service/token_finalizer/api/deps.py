"""Dependencies of the routes: the app's shared state and bearer-token auth."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request

from token_finalizer.api.errors import ApiError
from token_finalizer.api.state import ServiceState
from token_finalizer.settings import Settings

__all__ = ["Authenticated", "SettingsDep", "StateDep", "require_bearer_token", "service_state"]


# Every dependency is `async def` on purpose: FastAPI runs plain `def`
# dependencies in a worker thread, and those hops (three per finalize) cut the
# small-rollout throughput of a worker by about a fifth under load.


async def service_state(request: Request) -> ServiceState:
    """The state the app's lifespan created."""
    return request.app.state.service


StateDep = Annotated[ServiceState, Depends(service_state)]


async def _settings(state: StateDep) -> Settings:
    return state.settings


SettingsDep = Annotated[Settings, Depends(_settings)]

_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def _matches_any(presented: str, tokens: tuple[str, ...]) -> bool:
    # Compare against every token without stopping early: how long the check
    # takes must not reveal which configured token (if any) was close.
    wanted = presented.encode()
    found = False
    for token in tokens:
        found |= hmac.compare_digest(wanted, token.encode())
    return found


async def require_bearer_token(request: Request, settings: SettingsDep) -> None:
    """Refuse with 401 unless auth is off or the request bears a configured token."""
    tokens = settings.auth.bearer_tokens
    if not tokens:
        return
    header = request.headers.get("authorization")
    if header is None:
        raise ApiError(
            401, "missing bearer token (Authorization: Bearer <token>)", headers=_CHALLENGE
        )
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        raise ApiError(401, "Authorization header must be 'Bearer <token>'", headers=_CHALLENGE)
    if not _matches_any(presented.strip(), tokens):
        raise ApiError(401, "wrong bearer token", headers=_CHALLENGE)


Authenticated = Depends(require_bearer_token)
