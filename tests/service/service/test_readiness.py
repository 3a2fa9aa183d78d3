"""The readiness verdict: ready, draining or unavailable, with every source's ping, no status."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from token_finalizer import MemoryTokenStore
from token_finalizer.service.readiness import Readiness, readiness
from token_finalizer.service.state import ServiceState
from token_finalizer.settings import settings_from_mapping


class _DownStore(MemoryTokenStore):
    """A store whose ping fails: it cannot be reached."""

    async def ping(self) -> None:
        raise ConnectionError("refused")


async def _state(**sources: MemoryTokenStore) -> AsyncIterator[ServiceState]:
    settings = settings_from_mapping({"sources": {"local": {"kind": "memory"}}}, env={})
    async with ServiceState.open(settings, sources=sources) as state:
        yield state


@pytest.fixture
async def healthy() -> AsyncIterator[ServiceState]:
    """A state whose one source answers its ping."""
    async for state in _state():
        yield state


@pytest.fixture
async def one_down() -> AsyncIterator[ServiceState]:
    """A state with a second source, `gone`, that does not answer."""
    async for state in _state(gone=_DownStore()):
        yield state


@pytest.mark.anyio
async def test_every_source_answering_is_ready(healthy: ServiceState) -> None:
    """With every source reachable and no drain, the verdict is ready, without an error."""
    verdict = await readiness(healthy)
    assert verdict == Readiness("ready", {"local": {"reachable": True}})
    assert verdict.ready is True


@pytest.mark.anyio
async def test_a_draining_process_is_not_ready(healthy: ServiceState) -> None:
    """Once draining, the verdict is not ready even though every source answers."""
    healthy.begin_draining()
    verdict = await readiness(healthy)
    assert (verdict.ready, verdict.status, verdict.error) == (
        False,
        "draining",
        "the service is shutting down",
    )


@pytest.mark.anyio
async def test_an_unreachable_source_makes_the_process_unavailable(one_down: ServiceState) -> None:
    """A source that does not answer makes the verdict unavailable, naming that source."""
    verdict = await readiness(one_down)
    assert (verdict.ready, verdict.status) == (False, "unavailable")
    assert verdict.error == "source(s) unreachable: gone"
    assert verdict.sources["gone"]["reachable"] is False


def test_the_verdict_body_lists_status_error_and_sources_in_order() -> None:
    """The body is status, then the error when there is one, then the sources."""
    sources = {"local": {"reachable": True}}
    assert list(Readiness("draining", sources, "stopping").to_dict()) == [
        "status",
        "error",
        "sources",
    ]
    assert Readiness("ready", sources).to_dict() == {"status": "ready", "sources": sources}
