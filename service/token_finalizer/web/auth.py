"""The one bearer-token check, for the finalizer API and the store server.

Tokens are compared in constant time against every configured token without
stopping early, so how long a check takes tells nothing about how close a
guess was or which token it resembled.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Collection, MutableMapping, Sequence
from typing import Any

from token_finalizer.web.answers import error_response
from token_finalizer.web.errors import HttpError

__all__ = ["BearerTokenGuard", "check_bearer"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def _matches_any(presented: bytes, tokens: Sequence[bytes]) -> bool:
    found = False
    for token in tokens:
        found |= hmac.compare_digest(presented, token)
    return found


def check_bearer(header: str | None, tokens: Sequence[bytes]) -> None:
    """Raise HttpError 401 (with a Bearer challenge) unless `header` bears one of `tokens`."""
    if header is None:
        raise HttpError(
            401, "missing bearer token (Authorization: Bearer <token>)", headers=_CHALLENGE
        )
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        raise HttpError(401, "Authorization header must be 'Bearer <token>'", headers=_CHALLENGE)
    if not _matches_any(presented.strip().encode(), tokens):
        raise HttpError(401, "wrong bearer token", headers=_CHALLENGE)


class BearerTokenGuard:
    """ASGI wrapper answering 401 `{"error"}` unless the request bears a configured token.

    A plain ASGI wrapper rather than a Starlette BaseHTTPMiddleware: it never
    touches response bodies, so a 30 MB snapshot streams through untouched.
    Paths in `open_paths` (probes) pass without a token.
    """

    def __init__(
        self, app: ASGIApp, *, tokens: Sequence[str], open_paths: Collection[str] = ()
    ) -> None:
        if not tokens or not all(tokens):
            raise ValueError("a bearer token is empty; configure no tokens for no auth")
        self.app = app
        self._tokens = tuple(token.encode() for token in tokens)
        self._open_paths = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self._open_paths:
            await self.app(scope, receive, send)
            return
        header = None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                header = value.decode("latin-1")
                break
        try:
            check_bearer(header, self._tokens)
        except HttpError as refusal:
            response = error_response(refusal.status_code, refusal.message)
            response.headers.update(refusal.headers)
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
