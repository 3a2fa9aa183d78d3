"""The one error shape of both servers and the handler set that enforces it.

Every refusal is `{"error": "<message naming the problem>", ...details}`.
Framework errors (unknown path, wrong method, a bad query parameter) are
reshaped into it; each app adds its own exception-to-status table
(`api/errors.py`, `store_server/app.py`). An unexpected exception is logged
with its traceback and answered with a bare 500 that never carries its text
(which may hold a filesystem path or a secret).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from token_finalizer._constants import RETRY_AFTER_S
from token_finalizer.web.answers import error_response

__all__ = ["HttpError", "StatusTable", "install_error_handlers"]

logger = logging.getLogger(__name__)

# Exception class -> HTTP status; the first matching class (by isinstance) wins.
StatusTable = Mapping[type[Exception], int]
# What to answer for an unknown path, given the request (None: the generic message).
NotFoundHook = Callable[[Request], Response | None]


class HttpError(Exception):
    """A request refused by the HTTP plumbing itself (body, auth): status, message, details."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        headers: Mapping[str, str] | None = None,
        **details: Any,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.headers = dict(headers or {})
        self.details = details


def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HttpError)
    response = error_response(exc.status_code, exc.message, **exc.details)
    response.headers.update(exc.headers)
    return response


def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    problems = []
    for item in exc.errors():
        location = ".".join(str(part) for part in item.get("loc", ()))
        problems.append(f"{location}: {item.get('msg', 'invalid')}")
    return error_response(422, "invalid request: " + "; ".join(problems))


def _unexpected(request: Request, exc: Exception) -> Response:
    logger.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response(500, "internal error; the server log has the details")


def _framework_error(not_found: NotFoundHook | None) -> Callable[[Request, Exception], Response]:
    def handle(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 404:
            special = not_found(request) if not_found is not None else None
            if special is not None:
                return special
            message = f"no such endpoint: {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        response = error_response(exc.status_code, message)
        response.headers.update(exc.headers or {})
        return response

    return handle


def _domain_error(
    table: StatusTable, retry_after_s: int
) -> Callable[[Request, Exception], Response]:
    def handle(request: Request, exc: Exception) -> Response:
        status = next((code for cls, code in table.items() if isinstance(exc, cls)), 500)
        if status == 500:
            logger.error("%s %s failed: %s", request.method, request.url.path, exc)
            return error_response(status, f"{type(exc).__name__}: the server log has the details")
        details = getattr(exc, "details", None) or {}
        response = error_response(status, getattr(exc, "message", None) or str(exc), **details)
        if status == 503:
            # Unavailable for now, not broken: tell clients when to come back.
            response.headers["Retry-After"] = str(retry_after_s)
        return response

    return handle


def install_error_handlers(
    app: FastAPI,
    table: StatusTable,
    *,
    not_found: NotFoundHook | None = None,
    retry_after_s: int = RETRY_AFTER_S,
) -> None:
    """Give every refusal of `app` the one error shape; `table` maps domain errors to statuses.

    A 503 carries `Retry-After: retry_after_s`.
    """
    app.add_exception_handler(HttpError, _http_error)
    app.add_exception_handler(StarletteHTTPException, _framework_error(not_found))
    app.add_exception_handler(RequestValidationError, _validation_error)
    domain = _domain_error(table, retry_after_s)
    for cls in table:
        app.add_exception_handler(cls, domain)
    app.add_exception_handler(Exception, _unexpected)
