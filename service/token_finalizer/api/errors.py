"""The finalizer API's one table from service-layer refusals to HTTP statuses."""

from __future__ import annotations

from fastapi import FastAPI

from token_finalizer.service.errors import (
    InvalidRequest,
    MaskFractionExceeded,
    SourceUnreachable,
    StaleSnapshot,
    TicketRejected,
    UnknownSource,
)
from token_finalizer.service.guard import InvalidRunId
from token_finalizer.web.errors import StatusTable, install_error_handlers

__all__ = ["STATUS_OF", "install_api_error_handlers"]

STATUS_OF: StatusTable = {
    InvalidRequest: 422,
    InvalidRunId: 400,
    UnknownSource: 404,
    MaskFractionExceeded: 409,
    TicketRejected: 403,
    StaleSnapshot: 409,
    SourceUnreachable: 503,
}


def install_api_error_handlers(app: FastAPI) -> None:
    """Install the shared handler set with this API's status table."""
    install_error_handlers(app, STATUS_OF)
