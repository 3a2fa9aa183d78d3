"""The one bearer-token check, for the finalizer API and the store server.

Tokens are compared in constant time against every configured token without
stopping early, so how long a check takes tells nothing about how close a
guess was or which token it resembled.

The store server gives each token a set of roles and each route one role
(docs/store-protocol.md#roles): an unknown token is a 401, a known token
without the route's role a 403. The role is the one of the route that will
serve the request, found by the router's own matching: a path no route
serves is refused to every token.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from enum import Enum
from typing import Any

from token_finalizer.web.answers import error_response
from token_finalizer.web.errors import HttpError

__all__ = [
    "ANY_ROLE",
    "AccessOf",
    "BearerTokenGuard",
    "Unguarded",
    "check_bearer",
    "roles_of_bearer",
]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Unguarded(Enum):
    """A route the guard lets through unchecked."""

    OPEN = "open"  # probes: load balancers carry no token
    SELF_CHECKED = "self-checked"  # answers its own refusals, in its caller's shape


class AnyRole(Enum):
    """A route every configured token may use, whatever its roles (the store's /metrics)."""

    ANY = "any"


ANY_ROLE = AnyRole.ANY

# A request's scope -> the role of the route that will serve it (ANY_ROLE: any
# token's), Unguarded for a route checked elsewhere (or not at all), None when
# no route serves it.
AccessOf = Callable[[Scope], "str | AnyRole | Unguarded | None"]

_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def _matches_any(presented: bytes, tokens: Sequence[bytes]) -> bool:
    found = False
    for token in tokens:
        found |= hmac.compare_digest(presented, token)
    return found


def _presented(header: str | None) -> bytes:
    """The token of an `Authorization: Bearer <token>` header; HttpError 401 for anything else."""
    if header is None:
        raise HttpError(
            401, "missing bearer token (Authorization: Bearer <token>)", headers=_CHALLENGE
        )
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        raise HttpError(401, "Authorization header must be 'Bearer <token>'", headers=_CHALLENGE)
    return presented.strip().encode()


def check_bearer(header: str | None, tokens: Sequence[bytes]) -> None:
    """Raise HttpError 401 (with a Bearer challenge) unless `header` bears one of `tokens`."""
    if not _matches_any(_presented(header), tokens):
        raise HttpError(401, "wrong bearer token", headers=_CHALLENGE)


def roles_of_bearer(header: str | None, tokens: Mapping[str, Sequence[bytes]]) -> frozenset[str]:
    """The roles whose tokens `header` bears (role -> tokens); HttpError 401 when none.

    Every token of every role is compared, whatever matched before.
    """
    presented = _presented(header)
    roles = frozenset(role for role, held in tokens.items() if _matches_any(presented, held))
    if not roles:
        raise HttpError(401, "wrong bearer token", headers=_CHALLENGE)
    return roles


async def _not_found(scope: Scope, receive: Receive, send: Send) -> None:
    await error_response(404, f"no such path: {scope['path']}")(scope, receive, send)


class BearerTokenGuard:
    """ASGI wrapper answering 401 or 403 `{"error"}` unless the request bears a fitting token.

    `tokens` maps each role to its tokens; `access_of` names the role of the
    route that will serve a request (docs/store-protocol.md#roles), or
    `ANY_ROLE` for a route any known token may use. A plain
    ASGI wrapper rather than a Starlette BaseHTTPMiddleware: it never touches
    response bodies, so a 30 MB snapshot streams through untouched. Unguarded
    routes (probes, routes that check their token themselves) go through
    without a check here; a request no route serves is answered by `unknown`
    (a 404 by default) whichever token it bears.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        tokens: Mapping[str, Sequence[str]],
        access_of: AccessOf,
        unknown: ASGIApp = _not_found,
    ) -> None:
        every = [token for held in tokens.values() for token in held]
        if not every or not all(every):
            raise ValueError("a bearer token is empty; configure no tokens for no auth")
        self.app = app
        self._tokens = {
            role: tuple(token.encode() for token in held) for role, held in tokens.items()
        }
        self._access_of = access_of
        self._unknown = unknown

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        needed = self._access_of(scope)
        if isinstance(needed, Unguarded):
            await self.app(scope, receive, send)
            return
        header = None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                header = value.decode("latin-1")
                break
        try:
            held = roles_of_bearer(header, self._tokens)
            if isinstance(needed, str) and needed not in held:
                raise HttpError(
                    403,
                    f"this token may not {scope['method']} {scope['path']}: that needs a "
                    f"{needed} token (it holds: {', '.join(sorted(held))})",
                )
        except HttpError as refusal:
            response = error_response(refusal.status_code, refusal.message)
            response.headers.update(refusal.headers)
            await response(scope, receive, send)
            return
        if needed is None:
            await self._unknown(scope, receive, send)
            return
        await self.app(scope, receive, send)
