"""The service layer of POST /retire: verify the ticket, resolve the source, drop.

The body is the finalize answer's `retire` object, or the whole answer posted
back (its `retire` key is read). Only a ticket this service's key signed
retires anything, and only the exact snapshot it names: a caller cannot make
a masked build (evidence) retirable by editing what it posts.
See docs/finalizer-api.md#post-retire.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from token_finalizer.core.errors import InvalidRolloutId, StoreUnreachable, describe_exception
from token_finalizer.core.identity import check_store_id
from token_finalizer.service.errors import (
    InvalidRequest,
    SourceUnreachable,
    StaleSnapshot,
    TicketRejected,
    UnknownSource,
)
from token_finalizer.service.state import ServiceState
from token_finalizer.service.tickets import RetireTicket

__all__ = ["RetireResult", "retire_one", "retire_ticket", "ticket_body"]

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


@dataclass(frozen=True, slots=True)
class RetireResult:
    """The answer of one retire call and what the request log reports about it."""

    answer: dict[str, Any]
    rollout_id: str
    source: str
    outcome: str  # retired


async def retire_one(state: ServiceState, body: Mapping[str, Any]) -> RetireResult:
    """Drop the snapshot a verified ticket names: `{"retired": true}`.

    Raises InvalidRequest (malformed), TicketRejected (not signed by our key),
    UnknownSource, StaleSnapshot (the store moved on; nothing retired) and
    SourceUnreachable; each carries what is known of the call (rollout id,
    source, outcome) as far as it got (ServiceError.concerning).
    """
    try:
        ticket = state.tickets.verify(ticket_body(body))
    except TicketRejected as refusal:
        refusal.concerning(outcome="rejected")
        raise
    return await retire_ticket(state, ticket)


async def retire_ticket(state: ServiceState, ticket: RetireTicket) -> RetireResult:
    """`retire_one` for a ticket already verified (or trusted by a caller holding the store)."""
    try:
        rollout_id = check_store_id(ticket.rollout_id)
    except InvalidRolloutId as exc:
        raise InvalidRequest(f"retire: {exc}") from None
    try:
        source = state.sources.resolve(ticket.source)
    except UnknownSource as refusal:
        refusal.concerning(rollout_id=rollout_id)
        raise
    try:
        dropped = await source.drop(
            rollout_id, snapshot_id=ticket.snapshot_id, version=ticket.version
        )
    except Exception as exc:
        state.metrics.retire.labels(source.name, "failed").inc()
        if not isinstance(exc, _UNREACHABLE):
            # Not a reason to come back later: the 500 handler logs it, with this note.
            exc.add_note(f"retire of rollout {rollout_id} through source {source.name!r}")
            raise
        raise SourceUnreachable(
            f"retire of rollout {rollout_id} could not reach source {source.name!r}: "
            f"{describe_exception(exc)}",
            source=source.name,
        ).concerning(rollout_id=rollout_id, source=source.name, outcome="failed") from None
    outcome = "retired" if dropped else "stale"
    state.metrics.retire.labels(source.name, outcome).inc()
    if not dropped:
        raise StaleSnapshot(
            f"rollout {rollout_id}: the store no longer holds snapshot {ticket.snapshot_id} "
            f"version {ticket.version} (written to, or retired for another attempt, since); "
            "nothing was retired",
            retired=False,
        ).concerning(rollout_id=rollout_id, source=source.name, outcome=outcome)
    return RetireResult(
        answer={"retired": True}, rollout_id=rollout_id, source=source.name, outcome=outcome
    )
