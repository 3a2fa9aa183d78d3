"""A PROMETHEUS_MULTIPROC_DIR set by the operator, against real `serve` processes.

`serve` owns the directory's lifecycle: it creates a missing one, removes an
earlier run's value files before any worker starts (a fresh server counts
from zero), and leaves a file it cannot read out of the sum with a warning
instead of failing every scrape.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.captures import record_for
from tests.support.logs import messages
from tests.support.servers import free_port, running_process
from token_finalizer.service.metrics import MULTIPROC_DIR_ENV_VAR

# A value file whose header claims 4096 bytes of entries in a file of 16: what a
# crash or a full disk leaves behind.
TRUNCATED_VALUE_FILE = (4096).to_bytes(4, "little") + bytes(12)


@contextlib.contextmanager
def _serving(tmp_path: Path, metrics_dir: Path, *, workers: int = 1) -> Iterator[tuple[str, Path]]:
    """`serve` over a file source with PROMETHEUS_MULTIPROC_DIR=metrics_dir: URL and log file."""
    config = tmp_path / "config.yaml"
    config.write_text(f"sources:\n  local: {{kind: file, dir: '{tmp_path / 'capture'}'}}\n")
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    args = ["serve", "--config", str(config), "--port", str(port), "--workers", str(workers)]
    env = {MULTIPROC_DIR_ENV_VAR: str(metrics_dir)}
    with running_process(args, port=port, env=env, log=log):
        yield f"http://127.0.0.1:{port}", log


def _finalized(base: str, count: int, prefix: str) -> None:
    for i in range(count):
        answer = httpx.post(f"{base}/finalize", json=record_for(f"{prefix}-{i}"), timeout=10)
        assert answer.status_code == 200


def _finalize_total(base: str) -> tuple[int, float]:
    """The /metrics status and its token_finalizer_finalize_total, summed over labels."""
    answer = httpx.get(f"{base}/metrics", timeout=10)
    if answer.status_code != 200:
        return answer.status_code, 0.0
    total = sum(
        sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
        if sample.name == "token_finalizer_finalize_total"
    )
    return answer.status_code, total


@pytest.mark.parametrize("workers", [1, 2])
def test_a_missing_directory_is_created_and_counts(tmp_path: Path, workers: int) -> None:
    """The variable names a directory that does not exist: `serve` creates it and counts."""
    metrics_dir = tmp_path / "not" / "there" / "yet"
    with _serving(tmp_path, metrics_dir, workers=workers) as (base, _):
        _finalized(base, 3, "missing")
        scraped = _finalize_total(base)
    assert scraped == (200, 3.0)
    assert metrics_dir.is_dir()


def test_a_new_run_does_not_report_the_previous_runs_counts(tmp_path: Path) -> None:
    """3 finalizes, a restart over the same directory, 1 more: the new server says 1."""
    metrics_dir = tmp_path / "metrics"
    with _serving(tmp_path, metrics_dir) as (base, _):
        _finalized(base, 3, "first-run")
    assert list(metrics_dir.glob("*.db"))  # the first run's values were left behind
    with _serving(tmp_path, metrics_dir) as (base, _):
        _finalized(base, 1, "second-run")
        scraped = _finalize_total(base)
    assert scraped == (200, 1.0)


def test_files_an_operator_keeps_in_the_directory_stay(tmp_path: Path) -> None:
    """Only value files (`*.db`) of an earlier run are removed at start."""
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    (metrics_dir / "README").write_text("scraped by the node exporter")
    with _serving(tmp_path, metrics_dir) as (base, _):
        assert _finalize_total(base)[0] == 200
    assert (metrics_dir / "README").read_text() == "scraped by the node exporter"


def test_a_truncated_value_file_is_left_out_with_a_warning(tmp_path: Path) -> None:
    """A damaged file appearing during the run: /metrics still answers, with the other
    files' sum, and the log names the file once."""
    metrics_dir = tmp_path / "metrics"
    with _serving(tmp_path, metrics_dir) as (base, log):
        _finalized(base, 2, "damaged")
        damaged = metrics_dir / "counter_999999.db"
        damaged.write_bytes(TRUNCATED_VALUE_FILE)
        scrapes = [_finalize_total(base) for _ in range(3)]
    assert scrapes == [(200, 2.0)] * 3
    warnings = [line for line in log.read_text().splitlines() if str(damaged) in line]
    assert len(warnings) == 1 and "cannot be read" in warnings[0]


def test_an_unusable_directory_stops_serve_with_status_2(tmp_path: Path) -> None:
    """The variable names a regular file: `serve` exits 2 with one line naming it."""
    not_a_dir = tmp_path / "metrics"
    not_a_dir.write_text("")
    config = tmp_path / "config.yaml"
    config.write_text(f"sources:\n  local: {{kind: file, dir: '{tmp_path / 'capture'}'}}\n")
    result = subprocess.run(
        [sys.executable, "-m", "token_finalizer.cli", "serve", "--config", str(config)],
        env={**os.environ, MULTIPROC_DIR_ENV_VAR: str(not_a_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert messages(result.stderr).splitlines() == [
        f"token-finalizer serve: {MULTIPROC_DIR_ENV_VAR}={not_a_dir} is not a directory"
    ]
