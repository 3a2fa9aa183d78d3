"""HTTP errors of the finalizer API and the handlers that give them one shape.

Every error answer is `{"error": "<message naming the problem>", ...details}`;
framework errors (unknown path, wrong method, a bad query parameter) are
reshaped into it too, so clients need exactly one parser.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from token_finalizer._web import error_response

__all__ = ["ApiError", "install_error_handlers"]

logger = logging.getLogger(__name__)


class ApiError(Exception):
    """A request the service refuses: status, message and optional JSON details."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        **details: Any,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.headers = headers or {}
        self.details = details


def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    response = error_response(exc.status_code, exc.message, **exc.details)
    response.headers.update(exc.headers)
    return response


def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 404:
        message = f"no such endpoint: {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    response = error_response(exc.status_code, message)
    response.headers.update(exc.headers or {})
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
    return error_response(500, f"internal error: {type(exc).__name__}")


def install_error_handlers(app: FastAPI) -> None:
    """Route every refusal of `app` through `error_response`."""
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _unexpected)
