"""Where a batch of records is finalized and retired: a running service, or this process.

Both targets answer exactly what `POST /finalize` and `POST /retire` answer.
`ServiceTarget` goes through the client package (retries, zstd answers);
`InProcessTarget` runs the service's own finalize and retire steps on
sources it opens itself, so the agent filter, source resolution and the
mask-fraction guard behave as in the service, by construction.

Failures come in two kinds: a `LineRefusedError` concerns one line (a
record that is malformed or too large, a retire object that is not one, a
ticket that does not verify: `TicketRefusedError`) and a batch goes on; a
`BatchAbortedError` would repeat for every later record (wrong token, unknown
source, unreachable service, the run's mask fraction crossed) and stops it.

Tickets are always verified: in this process with the configured
`retire.key`, which `open_target` requires for a retire (docs/configuration.md#retire).
"""

from __future__ import annotations

from typing import Any, Protocol

from token_finalizer._constants import DEFAULT_RUN_ID
from token_finalizer.service.errors import (
    InvalidRequest,
    ServiceError,
    StaleSnapshot,
    TicketRejected,
)
from token_finalizer.settings import Settings

__all__ = [
    "BatchAbortedError",
    "BatchTarget",
    "InProcessTarget",
    "LineRefusedError",
    "ServiceTarget",
    "TicketRefusedError",
]

# What a refusal means for a batch, in one table per target kind: the record
# alone was refused (the batch goes on), or every later record would be too.
# Through a service, statuses that condemn the request itself stop one line
# (403 is a retire ticket that does not verify: the finalizer's only 403).
_LINE_STATUSES = frozenset({400, 413, 422})
_TICKET_STATUS = 403
# In this process, the service layer's own refusals.
_LINE_ERRORS: tuple[type[ServiceError], ...] = (InvalidRequest,)


class LineRefusedError(Exception):
    """This one line was refused; the next may well succeed."""


class TicketRefusedError(LineRefusedError):
    """A retire ticket that does not verify (forged, edited, or signed with another key)."""


class BatchAbortedError(Exception):
    """A failure every later record would meet too."""


def _classified(status_code: int, message: str) -> Exception:
    if status_code == _TICKET_STATUS:
        return TicketRefusedError(message)
    if status_code in _LINE_STATUSES:
        return LineRefusedError(message)
    return BatchAbortedError(message)


def _classified_refusal(refusal: ServiceError) -> Exception:
    if isinstance(refusal, TicketRejected):
        return TicketRefusedError(refusal.message)
    if isinstance(refusal, _LINE_ERRORS):
        return LineRefusedError(refusal.message)
    return BatchAbortedError(refusal.message)


class BatchTarget(Protocol):
    """What the batch commands need from wherever records are finalized."""

    async def finalize(self, record: dict[str, Any]) -> dict[str, Any]:
        """The finalize answer object of one record."""
        ...

    async def retire(self, ticket: dict[str, Any]) -> bool:
        """Retire the snapshot a finalize answer's `retire` object names; True when dropped."""
        ...

    async def close(self) -> None:
        """Release connections or sources."""
        ...


class ServiceTarget:
    """A running finalizer service, through `AsyncFinalizerClient`."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        run_id: str | None = None,
        source: str | None = None,
    ) -> None:
        from token_finalizer_client import AsyncFinalizerClient

        self._client = AsyncFinalizerClient(base_url, token=token, run_id=run_id)
        self._source = source

    @staticmethod
    def _classify(exc: Exception) -> Exception:
        from token_finalizer_client import APIStatusError

        if isinstance(exc, APIStatusError):
            return _classified(exc.status_code, str(exc))
        return BatchAbortedError(str(exc))

    async def finalize(self, record: dict[str, Any]) -> dict[str, Any]:
        """POST /finalize."""
        from token_finalizer_client import FinalizerError

        try:
            finalized = await self._client.finalize(record, source=self._source)
        except FinalizerError as exc:
            raise self._classify(exc) from None
        return finalized.to_answer()

    async def retire(self, ticket: dict[str, Any]) -> bool:
        """POST /retire."""
        from token_finalizer_client import FinalizerError

        try:
            return await self._client.retire(ticket)
        except FinalizerError as exc:
            raise self._classify(exc) from None

    async def close(self) -> None:
        """Close the client's connection pool."""
        await self._client.close()


class InProcessTarget:
    """The service's finalize and retire steps, on the configured sources, in this process."""

    def __init__(
        self, settings: Settings, *, run_id: str | None = None, source: str | None = None
    ) -> None:
        from token_finalizer.service.state import ServiceState

        self._state = ServiceState.open(settings)
        self._run_id = run_id or DEFAULT_RUN_ID
        self._source = source

    async def finalize(self, record: dict[str, Any]) -> dict[str, Any]:
        """The service's finalize step (numpy token arrays left as they are)."""
        from token_finalizer.service.finalizing import finalize_one

        try:
            result = await finalize_one(self._state, record, self._source, self._run_id)
        except ServiceError as refusal:
            raise _classified_refusal(refusal) from None
        return result.answer

    async def retire(self, ticket: dict[str, Any]) -> bool:
        """The service's retire step: the ticket is verified with the configured key.

        A ticket this process cannot verify is refused, never trusted: an
        all-zero "ticket" would otherwise delete a capture kept as evidence.
        """
        from token_finalizer.service.retiring import retire_one

        try:
            await retire_one(self._state, ticket)
        except StaleSnapshot:
            return False
        except ServiceError as refusal:
            raise _classified_refusal(refusal) from None
        return True

    async def close(self) -> None:
        """Close the service state this target opened (its sources and its guard)."""
        await self._state.aclose()
