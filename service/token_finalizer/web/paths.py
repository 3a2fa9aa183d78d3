"""Request paths holding control characters are refused (400) before any routing.

Starlette's route patterns end in `$`, which matches before a final newline,
so `/freeze%0A` would reach the freeze route while any table keyed by the
path as sent finds nothing (issue 29, docs/store-protocol.md#roles). No
route of either server takes a control character: refusing them here, in
front of the bearer check and the router, means no path decoded with one is
ever matched, guarded or logged as another.
"""

from __future__ import annotations

import re

from token_finalizer.web.answers import error_response
from token_finalizer.web.auth import ASGIApp, Receive, Scope, Send

__all__ = ["ControlCharacterRefusal", "control_character_in"]

# C0 controls and DEL, as the server decoded them from `%XX` escapes.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def control_character_in(path: str) -> str | None:
    """The first control character of a decoded path, None when it holds none."""
    found = _CONTROL.search(path)
    return None if found is None else found.group()


class ControlCharacterRefusal:
    """ASGI wrapper answering 400 `{"error"}` for a path holding a control character."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            found = control_character_in(scope["path"])
            if found is not None:
                response = error_response(
                    400, f"the request path holds a control character ({found!r})"
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
