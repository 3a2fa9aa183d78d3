"""The service layer of POST /retire: verify the ticket, resolve the source, drop.

The body is the finalize answer's `retire` object, or the whole answer posted
back (its `retire` key is read). Only a ticket this service's key signed
retires anything, and only the exact snapshot it names: a caller cannot make
a masked build (evidence) retirable by editing what it posts.
See docs/finalizer-api.md#retire.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from token_finalizer.core.errors import InvalidRolloutId, StoreUnreachable, describe_exception
from token_finalizer.core.identity import check_store_id
from token_finalizer.service.errors import (
    InvalidRequest,
    SourceUnreachable,
    StaleSnapshot,
    TicketRejected,
)
from token_finalizer.service.state import ServiceState
from token_finalizer.service.tickets import RetireTicket

__all__ = ["retire_one", "retire_ticket", "ticket_body"]

# Drop failures that mean "the store is out of reach now": worth a 503 and a retry.
# (A source plugged in from code may raise the builtin ones.)
_UNREACHABLE = (StoreUnreachable, ConnectionError, TimeoutError)


def ticket_body(body: Mapping[str, Any]) -> Mapping[str, Any]:
    if "retire" in body and "ticket" not in body:  # a whole finalize answer
        ticket = body["retire"]
        if ticket is None:
            raise InvalidRequest(
                "this finalize answer is not retirable (its build is masked, failed or absent): "
                "its capture stays in the store as evidence"
            )
        if not isinstance(ticket, Mapping):
            raise InvalidRequest("retire: `retire` must be the object finalize answered")
        return ticket
    return body


async def retire_one(
    state: ServiceState, body: Mapping[str, Any], *, log: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Drop the snapshot a verified ticket names: `{"retired": true}`.

    Raises InvalidRequest (malformed), TicketRejected (not signed by our key),
    UnknownSource, StaleSnapshot (the store moved on; nothing retired) and
    SourceUnreachable. `log` receives the request-log fields as they become known.
    """
    log = {} if log is None else log
    try:
        ticket = state.tickets.verify(ticket_body(body))
    except TicketRejected:
        log["outcome"] = "rejected"
        raise
    return await retire_ticket(state, ticket, log=log)


async def retire_ticket(
    state: ServiceState, ticket: RetireTicket, *, log: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`retire_one` for a ticket already verified (or trusted by a caller holding the store)."""
    log = {} if log is None else log
    try:
        rollout_id = check_store_id(ticket.rollout_id)
    except InvalidRolloutId as exc:
        raise InvalidRequest(f"retire: {exc}") from None
    log["rollout_id"] = rollout_id
    source = state.sources.resolve(ticket.source)
    log["source"] = source.name
    try:
        dropped = await source.drop(
            rollout_id, snapshot_id=ticket.snapshot_id, version=ticket.version
        )
    except Exception as exc:
        state.metrics.retire.labels(source.name, "failed").inc()
        log["outcome"] = "failed"
        if not isinstance(exc, _UNREACHABLE):
            raise  # not a reason to come back later: the 500 handler logs it
        raise SourceUnreachable(
            f"retire of rollout {rollout_id} could not reach source {source.name!r}: "
            f"{describe_exception(exc)}",
            source=source.name,
        ) from None
    outcome = "retired" if dropped else "stale"
    state.metrics.retire.labels(source.name, outcome).inc()
    log["outcome"] = outcome
    if not dropped:
        raise StaleSnapshot(
            f"rollout {rollout_id}: the store no longer holds snapshot {ticket.snapshot_id} "
            f"version {ticket.version} (written to, or retired for another attempt, since); "
            "nothing was retired",
            retired=False,
        )
    return {"retired": True}
