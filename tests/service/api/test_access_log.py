"""One structured (JSON) log line per request."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import orjson
import pytest

from tests.service.api.conftest import CaptureWriter
from tests.support.captures import record_for
from token_finalizer.api.access_log import ACCESS_LOGGER


def _lines(caplog: pytest.LogCaptureFixture, path: str) -> list[dict[str, Any]]:
    records = [r for r in caplog.records if r.name == ACCESS_LOGGER]
    lines = [orjson.loads(r.getMessage()) for r in records]
    return [line for line in lines if line["path"] == path]


def test_finalize_logs_one_line_with_rollout_source_outcome_and_duration(
    client: httpx.Client, write_capture: CaptureWriter, caplog: pytest.LogCaptureFixture
) -> None:
    """A finalize logs exactly one JSON line naming rollout, source, outcome, status, duration."""
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    write_capture("r-1")
    client.post("/finalize", json=record_for("r-1"))
    (line,) = _lines(caplog, "/finalize")
    duration = line.pop("duration_ms")
    assert isinstance(duration, float)
    assert line == {
        "method": "POST",
        "path": "/finalize",
        "status": 200,
        "rollout_id": "r-1",
        "source": "local",
        "outcome": "ok",
    }


def test_retire_logs_its_outcome(
    client: httpx.Client, write_capture: CaptureWriter, caplog: pytest.LogCaptureFixture
) -> None:
    """A retire's log line carries the rollout id and the retire outcome."""
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    write_capture("r-1")
    client.post("/retire", json=client.post("/finalize", json=record_for("r-1")).json())
    (line,) = _lines(caplog, "/retire")
    assert (line["rollout_id"], line["outcome"], line["status"]) == ("r-1", "retired", 200)


def test_refused_request_is_logged_with_its_status(
    client: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    """A 400 is logged too, with its status."""
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    client.post("/finalize", content=b"[]")
    (line,) = _lines(caplog, "/finalize")
    assert line["status"] == 400
