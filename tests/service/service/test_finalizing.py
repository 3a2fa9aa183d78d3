"""What a finalize reports besides its answer: rollout id, source and outcome, even refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support.captures import record_for
from token_finalizer import MemoryTokenStore
from token_finalizer.core import identity
from token_finalizer.core.entries import Snapshot
from token_finalizer.core.errors import StoreUnreachable
from token_finalizer.service.errors import MaskFractionExceeded, SourceUnreachable, UnknownSource
from token_finalizer.service.finalizing import finalize_one
from token_finalizer.service.state import ServiceState
from token_finalizer.settings import Settings, settings_from_mapping


class _UnreachableStore(MemoryTokenStore):
    """A store that cannot be reached: nothing is frozen."""

    async def freeze(self, rollout_id: str) -> Snapshot:
        raise StoreUnreachable("connection refused")


def _settings(**capture: Any) -> Settings:
    return settings_from_mapping(
        {"sources": {"local": {"kind": "memory"}}, "token_id_capture": capture}, env={}
    )


@pytest.fixture
async def service(store: MemoryTokenStore) -> AsyncIterator[ServiceState]:
    """A service over `store` whose guard trips at the first masked record."""
    settings = _settings(max_mask_fraction=0.0, mask_fraction_min_samples=1)
    async with ServiceState.open(settings, sources={"local": store}) as state:
        yield state


@pytest.mark.anyio
async def test_the_result_names_rollout_source_and_outcome(service: ServiceState) -> None:
    """A clean finalize reports its record's rollout id, the source used and outcome ok."""
    result = await finalize_one(service, record_for("r-1"), None, "run")
    assert (result.rollout_id, result.source, result.outcome) == ("r-1", "local", "ok")


@pytest.mark.anyio
async def test_an_unknown_source_names_the_rollout_but_no_source(service: ServiceState) -> None:
    """A refused source name carries the record's rollout id, and neither source nor outcome."""
    with pytest.raises(UnknownSource) as refused:
        await finalize_one(service, record_for("r-1"), "nowhere", "run")
    assert (refused.value.rollout_id, refused.value.source, refused.value.outcome) == (
        "r-1",
        None,
        None,
    )


@pytest.mark.anyio
async def test_a_guard_refusal_carries_outcome_guard_refused(service: ServiceState) -> None:
    """The crossing call's refusal names rollout, source and outcome guard_refused."""
    with pytest.raises(MaskFractionExceeded) as refused:
        await finalize_one(service, record_for("never-written"), None, "run")
    assert (refused.value.rollout_id, refused.value.source, refused.value.outcome) == (
        "never-written",
        "local",
        "guard_refused",
    )


@pytest.mark.anyio
async def test_an_unreachable_store_carries_outcome_unreachable() -> None:
    """A store out of reach is refused with rollout, source and outcome unreachable."""
    async with ServiceState.open(_settings(), sources={"local": _UnreachableStore()}) as state:
        with pytest.raises(SourceUnreachable) as refused:
            await finalize_one(state, record_for("r-1"), None, "run")
    assert (refused.value.rollout_id, refused.value.source, refused.value.outcome) == (
        "r-1",
        "local",
        "unreachable",
    )


@pytest.mark.anyio
async def test_the_rollout_id_is_derived_once_on_the_finalize_path(
    service: ServiceState, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One finalize reads the record's rollout id once: the build reuses the service's key."""
    derived: list[object] = []
    original = identity.rollout_id_of

    def counted(record: object) -> str | None:
        derived.append(record)
        return original(record)

    monkeypatch.setattr(identity, "rollout_id_of", counted)
    result = await finalize_one(service, record_for("r-1"), None, "run")
    assert (result.outcome, len(derived)) == ("ok", 1)
