"""Sources live as long as the app: opened at start-up, shared, closed at shutdown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.service.api.conftest import SettingsFactory
from tests.support.asgi import in_process
from tests.support.captures import record_for
from tests.support.stores import stored_state
from token_finalizer import MemoryTokenStore
from token_finalizer.api import create_app


class RecordingStore(MemoryTokenStore):
    """A memory store that remembers how often it was closed."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = 0

    async def close(self) -> None:
        self.closed += 1


def test_file_source_is_opened_at_start_up(make_settings: SettingsFactory, tmp_path: Path) -> None:
    """A configured file source's directory exists once the app is up, before any finalize."""
    directory = tmp_path / "made-at-start-up"
    settings = make_settings(sources={"extra": {"kind": "file", "dir": str(directory)}})
    with in_process(create_app(settings)):
        assert directory.is_dir()


def test_configured_sources_are_opened_once_and_closed_at_shutdown(
    make_settings: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each configured source is opened once for many requests and closed once at shutdown."""
    opened: list[RecordingStore] = []

    def fake_open(kind: str, **options: Any) -> RecordingStore:
        opened.append(RecordingStore())
        return opened[-1]

    monkeypatch.setattr("token_finalizer.service.registry.open_source", fake_open)
    with in_process(create_app(make_settings())) as client:
        for _ in range(3):
            client.post("/finalize", json=record_for("r-1"))
    assert [store.closed for store in opened] == [1]


def test_provided_source_is_used_and_left_open(make_settings: SettingsFactory) -> None:
    """A source passed to create_app serves its name and is not closed by the app."""
    provided = RecordingStore()
    app = create_app(make_settings(), sources={"embedded": provided})
    with in_process(app) as client:
        client.post("/finalize?source=embedded", json=record_for("r-1"))
    assert (stored_state(provided, "r-1").frozen, provided.closed) == (True, 0)


def test_shutdown_marks_the_app_draining(make_settings: SettingsFactory) -> None:
    """After the lifespan ends the app's state says draining (so /ready would answer 503)."""
    app = create_app(make_settings())
    with in_process(app):
        assert app.state.service.draining is False
    assert app.state.service.draining is True
