"""Optional bearer-token check in front of every store path except /health.

A plain ASGI wrapper rather than a Starlette BaseHTTPMiddleware: it never
touches response bodies, so a 30 MB snapshot streams through untouched.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from token_finalizer._web import error_response

__all__ = ["BearerTokenGuard"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Probes must work without the token: load balancers and /ready of the finalizer.
OPEN_PATHS = frozenset({"/health"})


class BearerTokenGuard:
    """Answer 401 `{"error"}` unless the request carries `Authorization: Bearer <token>`."""

    def __init__(self, app: ASGIApp, *, token: str) -> None:
        if not token:
            raise ValueError("the store token is empty; pass None for no auth")
        self.app = app
        self._token = token.encode()

    def _authorized(self, scope: Scope) -> bool:
        header = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                header = value
                break
        scheme, _, credentials = header.partition(b" ")
        # compare_digest: the time taken must not tell how much of a guess was right.
        return scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), self._token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        response = error_response(401, "missing or wrong bearer token")
        response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, send)
