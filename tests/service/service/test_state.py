"""The service state owns what it opened: leaving it closes its sources and its guard, once."""

from __future__ import annotations

import pytest

from token_finalizer.core.build import Build
from token_finalizer.core.entries import Snapshot
from token_finalizer.service import registry, state
from token_finalizer.service.state import ServiceState
from token_finalizer.settings import Settings, settings_from_mapping


class _ClosingSource:
    """A TokenSource stand-in that counts its closes."""

    def __init__(self) -> None:
        self.closes = 0

    async def freeze(self, rollout_id: str) -> Snapshot:
        raise AssertionError("not used")

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        raise AssertionError("not used")

    async def close(self) -> None:
        self.closes += 1


class _ClosingGuard:
    """A RunGuard stand-in that counts its closes."""

    enabled = False

    def __init__(self) -> None:
        self.closes = 0

    async def check(self, run_id: str) -> None:
        """Never refuses."""

    async def observe(self, run_id: str, build: Build | None) -> None:
        """Counts nothing."""

    async def probe(self) -> None:
        """Nothing to reach."""

    async def aclose(self) -> None:
        self.closes += 1


@pytest.fixture
def settings() -> Settings:
    """One configured source, `opened`, which the state opens (and so owns)."""
    return settings_from_mapping({"sources": {"opened": {"kind": "memory"}}}, env={})


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> _ClosingSource:
    """What the registry opens for a configured source."""
    source = _ClosingSource()
    monkeypatch.setattr(registry, "open_source", lambda kind, **options: source)
    return source


@pytest.fixture
def guard(monkeypatch: pytest.MonkeyPatch) -> _ClosingGuard:
    """The guard the state opens."""
    opened_guard = _ClosingGuard()
    monkeypatch.setattr(state, "open_guard", lambda settings, metrics: opened_guard)
    return opened_guard


@pytest.mark.anyio
async def test_leaving_the_state_closes_its_sources_and_its_guard(
    settings: Settings, opened: _ClosingSource, guard: _ClosingGuard
) -> None:
    """`async with` closes the sources the state opened and the guard's connections."""
    async with ServiceState.open(settings) as service:
        assert (opened.closes, guard.closes) == (0, 0)
        assert service.sources.names == ["opened"]
    assert (opened.closes, guard.closes) == (1, 1)


@pytest.mark.anyio
async def test_closing_twice_closes_once(
    settings: Settings, opened: _ClosingSource, guard: _ClosingGuard
) -> None:
    """A second aclose (or an exit after one) closes nothing again."""
    async with ServiceState.open(settings) as service:
        await service.aclose()
    await service.aclose()
    assert (opened.closes, guard.closes) == (1, 1)


@pytest.mark.anyio
async def test_sources_given_in_code_stay_open(
    settings: Settings, opened: _ClosingSource, guard: _ClosingGuard
) -> None:
    """A source handed in by its caller is the caller's to close."""
    given = _ClosingSource()
    async with ServiceState.open(settings, sources={"given": given}) as service:
        assert service.sources.names == ["given", "opened"]
    assert (given.closes, opened.closes) == (0, 1)


@pytest.mark.anyio
async def test_leaving_on_an_error_still_closes(
    settings: Settings, opened: _ClosingSource, guard: _ClosingGuard
) -> None:
    """An exception inside the block closes the state on its way out."""
    with pytest.raises(RuntimeError, match="inside"):
        async with ServiceState.open(settings):
            raise RuntimeError("inside")
    assert (opened.closes, guard.closes) == (1, 1)
