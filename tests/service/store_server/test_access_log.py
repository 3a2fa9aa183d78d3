"""The store server logs one JSON line per request, and probes only at debug level."""

from __future__ import annotations

import logging

import pytest

from tests.support.asgi import in_process
from tests.support.captures import make_entry
from token_finalizer import MemoryTokenStore
from token_finalizer.store_server import create_store_app
from token_finalizer.web.access_log import ACCESS_LOGGER


def test_health_probes_stay_out_of_the_access_log(caplog: pytest.LogCaptureFixture) -> None:
    """Many /health probes and one put log exactly one INFO request line: the put's."""
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    with in_process(create_store_app(MemoryTokenStore())) as client:
        for _ in range(5):
            assert client.get("/health").status_code == 200
        path = "/ng-rollout/r1/training-token-capture/calls/c1"
        assert client.put(path, json=make_entry("r1", "c1", [1], [2])).status_code == 200
    lines = [r for r in caplog.records if r.name == ACCESS_LOGGER and r.levelno >= logging.INFO]
    assert [r.json_fields["path"] for r in lines] == [path]  # type: ignore[attr-defined]  # set by the logger's `extra`
