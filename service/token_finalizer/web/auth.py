"""The one bearer-token check, for the finalizer API and the store server.

Tokens are compared in constant time against every configured token without
stopping early, so how long a check takes tells nothing about how close a
guess was or which token it resembled.

The store server gives each token a set of roles and each route one role
(docs/store-protocol.md#roles): an unknown token is a 401, a known token
without the route's role a 403.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Collection, Mapping, MutableMapping, Sequence
from typing import Any

from token_finalizer.web.answers import error_response
from token_finalizer.web.errors import HttpError

__all__ = ["BearerTokenGuard", "RoleOf", "check_bearer", "roles_of_bearer"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
# (method, path) -> the role the route needs, or None for a path no role governs.
RoleOf = Callable[[str, str], str | None]

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


def _no_role(method: str, path: str) -> str | None:
    return None


class BearerTokenGuard:
    """ASGI wrapper answering 401 or 403 `{"error"}` unless the request bears a fitting token.

    `tokens` maps each role to its tokens; `role_of` names the role a request
    needs (None: any configured token will do). A plain ASGI wrapper rather
    than a Starlette BaseHTTPMiddleware: it never touches response bodies, so a
    30 MB snapshot streams through untouched. Paths in `open_paths` (probes),
    and requests `passes(method, path)` admits (routes that check their token
    themselves), go through without a check here.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        tokens: Mapping[str, Sequence[str]],
        role_of: RoleOf = _no_role,
        open_paths: Collection[str] = (),
        passes: Callable[[str, str], bool] | None = None,
    ) -> None:
        every = [token for held in tokens.values() for token in held]
        if not every or not all(every):
            raise ValueError("a bearer token is empty; configure no tokens for no auth")
        self.app = app
        self._tokens = {
            role: tuple(token.encode() for token in held) for role, held in tokens.items()
        }
        self._role_of = role_of
        self._open_paths = frozenset(open_paths)
        self._passes = passes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] in self._open_paths
            or (self._passes is not None and self._passes(scope["method"], scope["path"]))
        ):
            await self.app(scope, receive, send)
            return
        header = None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                header = value.decode("latin-1")
                break
        try:
            held = roles_of_bearer(header, self._tokens)
            needed = self._role_of(scope["method"], scope["path"])
            if needed is not None and needed not in held:
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
        await self.app(scope, receive, send)
