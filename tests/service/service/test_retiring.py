"""What a retire reports besides its answer: rollout id, source and outcome, even refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support.captures import record_for
from token_finalizer import MemoryTokenStore
from token_finalizer.service.errors import StaleSnapshot, TicketRejected
from token_finalizer.service.finalizing import finalize_one
from token_finalizer.service.retiring import retire_one
from token_finalizer.service.state import ServiceState
from token_finalizer.settings import settings_from_mapping


@pytest.fixture
async def service(store: MemoryTokenStore) -> AsyncIterator[ServiceState]:
    """A service over `store` as source `local`."""
    settings = settings_from_mapping({"sources": {"local": {"kind": "memory"}}}, env={})
    async with ServiceState.open(settings, sources={"local": store}) as state:
        yield state


@pytest.fixture
async def ticket(service: ServiceState) -> dict[str, Any]:
    """The retire ticket of a clean finalize of `r-1`."""
    result = await finalize_one(service, record_for("r-1"), None, "run")
    retire: dict[str, Any] = result.answer["retire"]
    return retire


@pytest.mark.anyio
async def test_the_result_names_rollout_source_and_outcome(
    service: ServiceState, ticket: dict[str, Any]
) -> None:
    """A retire that dropped the snapshot reports its rollout, source and outcome retired."""
    result = await retire_one(service, ticket)
    assert result.answer == {"retired": True}
    assert (result.rollout_id, result.source, result.outcome) == ("r-1", "local", "retired")


@pytest.mark.anyio
async def test_a_rejected_ticket_carries_only_outcome_rejected(
    service: ServiceState, ticket: dict[str, Any]
) -> None:
    """An edited ticket is refused before anything is known but its outcome, rejected."""
    with pytest.raises(TicketRejected) as refused:
        await retire_one(service, {**ticket, "version": ticket["version"] + 1})
    assert (refused.value.rollout_id, refused.value.source, refused.value.outcome) == (
        None,
        None,
        "rejected",
    )


@pytest.mark.anyio
async def test_a_stale_ticket_carries_outcome_stale(
    service: ServiceState, store: MemoryTokenStore, ticket: dict[str, Any]
) -> None:
    """A genuine ticket the store moved past is refused with rollout, source and stale."""
    await store.mark_incomplete("r-1", "late")
    with pytest.raises(StaleSnapshot) as refused:
        await retire_one(service, ticket)
    assert (refused.value.rollout_id, refused.value.source, refused.value.outcome) == (
        "r-1",
        "local",
        "stale",
    )
