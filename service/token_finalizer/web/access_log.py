"""One structured (JSON) log line per request.

A pure ASGI middleware times each request and, when the answer has been sent,
logs method, path, status and duration_ms plus the fields the route added
(rollout id, source, outcome) via `log_fields(request)`. Headers are never
logged, so bearer tokens cannot leak into logs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from token_finalizer._logging import FIELDS_ATTRIBUTE
from token_finalizer.web.answer_done import call_until_answered

__all__ = ["ACCESS_LOGGER", "AccessLogMiddleware", "log_fields", "request_log_fields"]

ACCESS_LOGGER = "token_finalizer.access"
_FIELDS_KEY = "token_finalizer_log"
# Probes arrive every few seconds from orchestrators; logging them at INFO
# would bury the finalize lines.
_QUIET_PATHS = frozenset({"/health", "/ready", "/metrics"})

logger = logging.getLogger(ACCESS_LOGGER)


def log_fields(request: Request) -> dict[str, Any]:
    """The mutable dict of extra fields this request's log line will carry."""
    state = request.scope.setdefault("state", {})
    fields: dict[str, Any] = state.setdefault(_FIELDS_KEY, {})  # only ever set here
    return fields


def request_log_fields(scope: Scope) -> dict[str, Any]:
    """The fields a served request's log line got (empty before or without this middleware)."""
    fields = scope.get("state", {}).get(_FIELDS_KEY)
    return fields if isinstance(fields, dict) else {}


class AccessLogMiddleware:
    """Logs every HTTP request once, after its answer, as a JSON object.

    `observe(path, status, seconds)` is called first, for latency metrics.
    """

    def __init__(
        self, app: ASGIApp, observe: Callable[[str, int, float], None] | None = None
    ) -> None:
        self.app = app
        self._observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        fields: dict[str, Any] = {}
        scope.setdefault("state", {})[_FIELDS_KEY] = fields

        def answered(status: int) -> None:
            self._record(scope, status, time.perf_counter() - started, fields)

        await call_until_answered(self.app, scope, receive, send, answered)

    def _record(self, scope: Scope, status: int, seconds: float, fields: dict[str, Any]) -> None:
        path = scope.get("path", "")
        if self._observe is not None:
            self._observe(path, status, seconds)
        line = {
            "method": scope.get("method"),
            "path": path,
            "status": status,
            "duration_ms": round(seconds * 1000, 2),
            **fields,
        }
        level = logging.DEBUG if path in _QUIET_PATHS and status < 400 else logging.INFO
        logger.log(level, "request", extra={FIELDS_ATTRIBUTE: line})
