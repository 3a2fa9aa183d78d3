"""What the service layer refuses, in its own terms (no HTTP here).

    ServiceError                 base
    ├── InvalidRequest           a request body the operation cannot use (a retire without an id...)
    ├── UnknownSource            a source name that is not configured
    ├── MaskFractionExceeded     the run crossed `token_id_capture.max_mask_fraction`
    ├── TicketRejected           a retire ticket that does not verify (forged or edited)
    ├── StaleSnapshot            a valid ticket for a snapshot the store no longer holds
    └── SourceUnreachable        a store that could not be reached: retry later

The HTTP API maps each class to a status in one table (`api/errors.py`); the
batch command line maps them to line outcomes and exit codes in another.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

__all__ = [
    "InvalidRequest",
    "MaskFractionExceeded",
    "ServiceError",
    "SourceUnreachable",
    "StaleSnapshot",
    "TicketRejected",
    "UnknownSource",
]


class ServiceError(Exception):
    """Base of every refusal of the service layer; `details` go into the error answer.

    `rollout_id`, `source` and `outcome` say what the refused call concerned,
    as far as it got (None: not known); transports log them, they are not
    part of the answer.
    """

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: Mapping[str, Any] = details
        self.rollout_id: str | None = None
        self.source: str | None = None
        self.outcome: str | None = None

    def concerning(
        self,
        *,
        rollout_id: str | None = None,
        source: str | None = None,
        outcome: str | None = None,
    ) -> Self:
        """Note what the refused call concerned (None leaves a field as it is); returns self."""
        if rollout_id is not None:
            self.rollout_id = rollout_id
        if source is not None:
            self.source = source
        if outcome is not None:
            self.outcome = outcome
        return self


class InvalidRequest(ServiceError):
    """A request whose content the operation cannot use."""


class UnknownSource(ServiceError):
    """A source name that is not configured (sources are never created on the fly)."""


class MaskFractionExceeded(ServiceError):
    """The run masked more than its allowed fraction; details: finalized, masked, reasons."""


class TicketRejected(ServiceError):
    """A retire ticket that this service's key did not sign: nothing is retired."""


class StaleSnapshot(ServiceError):
    """The ticket is genuine, but the store moved on (a later write): nothing is retired."""


class SourceUnreachable(ServiceError):
    """The source could not be reached before anything changed there: safe to retry."""
