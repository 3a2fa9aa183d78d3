"""One structured (JSON) log line per request."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import httpx
import orjson
import pytest

from tests.service.api.conftest import CaptureWriter, SettingsFactory
from tests.support.asgi import in_process
from tests.support.captures import record_for
from token_finalizer import FileTokenStore
from token_finalizer._logging import JsonFormatter
from token_finalizer.api import create_app
from token_finalizer.web.access_log import ACCESS_LOGGER


def _lines(caplog: pytest.LogCaptureFixture, path: str) -> list[dict[str, Any]]:
    """The request fields of the JSON lines logged for `path` (envelope keys checked, dropped)."""
    records = [r for r in caplog.records if r.name == ACCESS_LOGGER]
    lines = [orjson.loads(JsonFormatter().format(r)) for r in records]
    for line in lines:
        assert (line.pop("logger"), line.pop("message")) == (ACCESS_LOGGER, "request")
        assert isinstance(line.pop("ts"), str) and line.pop("level") in {"info", "debug"}
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


def test_refused_ticket_logs_outcome_rejected(
    client: httpx.Client, write_capture: CaptureWriter, caplog: pytest.LogCaptureFixture
) -> None:
    """A retire whose ticket does not verify is logged with outcome rejected and status 403."""
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    write_capture("r-1")
    ticket = client.post("/finalize", json=record_for("r-1")).json()["retire"]
    client.post("/retire", json={**ticket, "version": ticket["version"] + 1})
    (line,) = _lines(caplog, "/retire")
    assert (line["outcome"], line["status"]) == ("rejected", 403)


def test_stale_ticket_logs_outcome_stale(
    client: httpx.Client,
    write_capture: CaptureWriter,
    file_store: FileTokenStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A genuine ticket the store moved past is logged with outcome stale and status 409."""
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    write_capture("r-1")
    answer = client.post("/finalize", json=record_for("r-1")).json()
    anyio.run(file_store.mark_incomplete, "r-1", "late")
    client.post("/retire", json=answer)
    (line,) = _lines(caplog, "/retire")
    assert (line["rollout_id"], line["outcome"], line["status"]) == ("r-1", "stale", 409)


def test_refused_request_is_logged_with_its_status(
    client: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    """A 400 is logged too, with its status."""
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    client.post("/finalize", content=b"[]", headers={"Content-Type": "application/json"})
    (line,) = _lines(caplog, "/finalize")
    assert line["status"] == 400


def test_unknown_source_logs_the_rollout_but_no_source(
    client: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    """A finalize refused for its source name logs the rollout id, no source and no outcome."""
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    client.post("/finalize", params={"source": "nowhere"}, json=record_for("r-1"))
    (line,) = _lines(caplog, "/finalize")
    line.pop("duration_ms")
    assert line == {"method": "POST", "path": "/finalize", "status": 404, "rollout_id": "r-1"}


def test_record_without_rollout_id_logs_it_as_null(
    client: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    """A finalize of a record naming no rollout logs rollout_id null, the source and masked."""
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    record = record_for("r-1")
    del record["_ng_rollout_id"]
    client.post("/finalize", json=record)
    (line,) = _lines(caplog, "/finalize")
    assert (line["rollout_id"], line["source"], line["outcome"]) == (None, "local", "masked")


def test_guard_refusal_logs_outcome_guard_refused(
    make_settings: SettingsFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The call that trips the run's guard is logged with outcome guard_refused and 409."""
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    settings = make_settings(
        token_id_capture={"max_mask_fraction": 0.0, "mask_fraction_min_samples": 1}
    )
    with in_process(create_app(settings)) as guarded:
        guarded.post("/finalize", json=record_for("never-written"))
    (line,) = _lines(caplog, "/finalize")
    assert (line["rollout_id"], line["source"], line["outcome"], line["status"]) == (
        "never-written",
        "local",
        "guard_refused",
        409,
    )
