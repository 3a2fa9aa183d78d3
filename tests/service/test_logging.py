"""Our logs: one JSON object per line, retries included, at the level the environment names.

In-process checks of the formatter and the configuration, then the real
thing: the CLI and the service as processes, retrying against a hostile
server on loopback, with their stderr read line by line.
"""

from __future__ import annotations

import io
import logging
import logging.config
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import respx

from tests.client.answers import plain_answer
from tests.client.hostile_server import Canned, HostileServer
from tests.support.captures import record_for
from tests.support.servers import free_port, wait_for_health
from token_finalizer._logging import (
    CLIENT_LOGGER,
    LOG_LEVEL_ENV_VAR,
    SERVICE_LOGGER,
    JsonFormatter,
    cli_logging,
    log_level,
    logging_config,
)
from token_finalizer_client import FinalizerClient

JSON = {"content-type": "application/json"}
BUSY = Canned(503, b'{"error": "busy"}', JSON)
SERVE = [sys.executable, "-m", "token_finalizer.cli", "serve"]
RETRY_FIELDS = {"event", "method", "path", "attempt", "attempts", "wait_s", "error"}


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of `text` as a JSON object (fails on any line that is not one)."""
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


# -- the level ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "level"),
    [(None, "INFO"), ("warning", "WARNING"), (" Error ", "ERROR"), ("", "INFO")],
    ids=["unset", "warning", "spaced-capital", "empty"],
)
def test_log_level_reads_the_variable(value: str | None, level: str) -> None:
    """The variable names the level in any case; unset or empty means info."""
    environ = {} if value is None else {LOG_LEVEL_ENV_VAR: value}
    assert log_level(environ) == level


def test_an_unknown_level_is_refused_by_name() -> None:
    """A level that does not exist is a ValueError naming the variable and the choices."""
    with pytest.raises(ValueError, match=f"{LOG_LEVEL_ENV_VAR}='loud'.*debug, info"):
        log_level({LOG_LEVEL_ENV_VAR: "loud"})


def test_server_logging_puts_the_client_logger_on_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvicorn's configuration sends both of our loggers to stderr as JSON, at the level."""
    monkeypatch.setenv(LOG_LEVEL_ENV_VAR, "error")
    loggers = logging_config()["loggers"]
    expected = {"handlers": ["stderr"], "level": "ERROR", "propagate": False}
    assert loggers[CLIENT_LOGGER] == loggers[SERVICE_LOGGER] == expected


def test_server_log_lines_follow_the_stream_that_is_current(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The servers' handlers write to sys.stderr as it is at each line, so a stream swapped
    out (and closed) since the logging was configured is never written to."""
    logging.config.dictConfig(
        {
            "version": 1,
            "incremental": False,
            "disable_existing_loggers": False,
            "formatters": logging_config()["formatters"],
            "handlers": {"stderr": logging_config()["handlers"]["stderr"]},
            "loggers": {"tf-test-current-stream": {"handlers": ["stderr"], "level": "INFO"}},
        }
    )
    test_logger = logging.getLogger("tf-test-current-stream")
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    test_logger.info("one")
    first.close()
    monkeypatch.setattr(sys, "stderr", second)
    test_logger.info("two")
    test_logger.handlers.clear()
    assert orjson.loads(second.getvalue())["message"] == "two"


# -- the lines ---------------------------------------------------------------------------------


def test_a_retry_record_becomes_one_json_line_with_its_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client's retry warning, formatted, is one JSON object holding its fields as keys."""
    with respx.mock(base_url="http://f.test") as router, caplog.at_level(logging.WARNING):
        router.get("/health").mock(side_effect=[httpx.Response(504), httpx.Response(200, json={})])
        with FinalizerClient("http://f.test") as client:
            client.health()
    (record,) = [r for r in caplog.records if r.name == CLIENT_LOGGER]
    line = JsonFormatter().format(record)
    assert "\n" not in line
    fields = orjson.loads(line)
    assert (fields["level"], fields["logger"], fields["path"], fields["error"]) == (
        "warning",
        CLIENT_LOGGER,
        "/health",
        "HTTP 504",
    )
    assert set(fields) >= RETRY_FIELDS


def test_cli_logging_leaves_the_loggers_as_it_found_them() -> None:
    """After the block, our loggers have their handlers and levels of before (in-process runs)."""
    loggers = [logging.getLogger(name) for name in (SERVICE_LOGGER, CLIENT_LOGGER)]
    before = [(list(logger.handlers), logger.level, logger.propagate) for logger in loggers]
    with cli_logging("ERROR"):
        assert all(logger.level == logging.ERROR for logger in loggers)
    assert [(list(lg.handlers), lg.level, lg.propagate) for lg in loggers] == before


# -- the CLI and the service as processes ------------------------------------------------------


def run_cli(*args: str, level: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != LOG_LEVEL_ENV_VAR}
    if level is not None:
        env[LOG_LEVEL_ENV_VAR] = level
    return subprocess.run(
        [sys.executable, "-m", "token_finalizer.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.fixture
def batch(tmp_path: Path) -> tuple[Path, Path]:
    """A one-record batch to finalize, and where its answers go."""
    batch = tmp_path / "in.jsonl"
    batch.write_bytes(orjson.dumps(record_for("r-1")) + b"\n")
    return batch, tmp_path / "out.jsonl"


@pytest.fixture
def busy_once() -> Iterator[str]:
    """A finalizer that answers 503 once, then a finalize answer."""
    server = HostileServer(BUSY, Canned(200, orjson.dumps(plain_answer()), JSON))
    with server.running() as url:
        yield url


def test_cli_logs_a_retry_as_one_json_line(busy_once: str, batch: tuple[Path, Path]) -> None:
    """`finalize --server` retrying a 503 writes one JSON retry line, and no stamina line."""
    source, output = batch
    result = run_cli("finalize", str(source), "-o", str(output), "--server", busy_once)
    assert result.returncode == 0, result.stderr
    retries = [line for line in result.stderr.splitlines() if '"event":"retry"' in line]
    assert len(retries) == 1
    fields = orjson.loads(retries[0])
    assert set(fields) >= RETRY_FIELDS
    assert (fields["method"], fields["path"], fields["attempt"]) == ("POST", "/finalize", 1)
    assert "stamina" not in result.stderr


def test_cli_log_level_error_silences_retries(busy_once: str, batch: tuple[Path, Path]) -> None:
    """TOKEN_FINALIZER_LOG_LEVEL=error drops the retry warnings."""
    source, output = batch
    result = run_cli(
        "finalize", str(source), "-o", str(output), "--server", busy_once, level="error"
    )
    assert result.returncode == 0, result.stderr
    assert '"event":"retry"' not in result.stderr and "stamina" not in result.stderr


def test_cli_refuses_an_unknown_log_level(batch: tuple[Path, Path]) -> None:
    """An unknown level exits 2 with one line naming the variable, before doing anything."""
    source, output = batch
    result = run_cli("finalize", str(source), "-o", str(output), "--server", "http://x", level="x")
    assert (result.returncode, len(result.stderr.splitlines())) == (2, 1)
    assert LOG_LEVEL_ENV_VAR in result.stderr and not output.exists()


def test_service_logs_a_source_retry_as_json(tmp_path: Path) -> None:
    """The service retrying an unavailable http source writes JSON retry lines on stderr."""
    server = HostileServer(BUSY)
    with server.running() as store_url:
        config = tmp_path / "config.yaml"
        config.write_text(f"sources:\n  remote: {{kind: http, url: '{store_url}'}}\n")
        port = free_port()
        stderr = tmp_path / "stderr.log"
        env = {key: value for key, value in os.environ.items() if key != LOG_LEVEL_ENV_VAR}
        with stderr.open("wb") as sink:
            process = subprocess.Popen(
                [*SERVE, "--config", str(config), "--port", str(port)],
                stdout=subprocess.DEVNULL,
                stderr=sink,
                env=env,
            )
            try:
                wait_for_health(f"http://127.0.0.1:{port}/health", process=process)
                answer = httpx.post(f"http://127.0.0.1:{port}/finalize", json=record_for("r-1"))
            finally:
                process.terminate()
                process.wait(timeout=60)
    assert answer.status_code == 503
    lines = json_lines(stderr.read_text())  # every line of stderr is JSON
    retries = [line for line in lines if line.get("event") == "retry"]
    assert retries and {line["path"] for line in retries} == {
        "/ng-rollout/r-1/training-token-capture/freeze"
    }
    assert all(set(line) >= RETRY_FIELDS and line["level"] == "warning" for line in retries)
