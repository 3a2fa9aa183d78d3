"""Prometheus metrics of `serve --workers 2` as a real process: every scrape sees every worker.

`serve` points PROMETHEUS_MULTIPROC_DIR at a fresh directory under $TMPDIR
before the workers start; the test sets TMPDIR to its own directory, so it
can read the per-worker files there and check that more than one worker
served, and that the directory is gone once the server stopped.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import httpx
import pytest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from tests.support.captures import agent_rollout, record_for
from tests.support.servers import free_port, running_process
from token_finalizer import FileTokenStore
from token_finalizer.service.metrics import MULTIPROC_DIR_ENV_VAR, multiprocess_directory

ROUND = 20
MAX_ROUNDS = 5


def _sample_sum(families: object, metric: str, **labels: str) -> float:
    total = 0.0
    for family in families:  # type: ignore[attr-defined]
        for sample in family.samples:
            if sample.name == metric and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def _scraped(base: str, metric: str, **labels: str) -> float:
    # A fresh connection per scrape, so scrapes land on either worker.
    with httpx.Client(base_url=base, timeout=10) as client:
        text = client.get("/metrics").text
    return _sample_sum(text_string_to_metric_families(text), metric, **labels)


def _finalizes_per_worker(directory: Path) -> dict[str, float]:
    """token_finalizer_finalize_total of each worker, read from its own counter file."""
    counts = {}
    for path in directory.glob("counter_*.db"):
        families = MultiProcessCollector.merge([str(path)])
        counts[path.stem] = _sample_sum(families, "token_finalizer_finalize_total")
    return counts


def _serve_command(
    tmp_path: Path, capture_dir: Path, *extra: str
) -> tuple[list[str], int, dict[str, str], Path]:
    """`serve` over a file source with its own TMPDIR: args, port, environment, that TMPDIR."""
    config = tmp_path / "config.yaml"
    config.write_text(f"sources:\n  local: {{kind: file, dir: '{capture_dir}'}}\n")
    temp = tmp_path / "tmp"
    temp.mkdir()
    port = free_port()
    args = ["serve", "--config", str(config), "--port", str(port), *extra]
    return args, port, {"TMPDIR": str(temp)}, temp


def test_two_workers_scrape_as_one(tmp_path: Path, capture_dir: Path) -> None:
    """20 finalizes on fresh connections through 2 workers: every scrape says 20."""
    args, port, env, temp = _serve_command(tmp_path, capture_dir, "--workers", "2")
    base = f"http://127.0.0.1:{port}"
    sent = 0
    with running_process(args, port=port, env=env) as process:
        (metrics_dir,) = temp.glob("token-finalizer-metrics-*")
        # Fresh connections are spread by the kernel; in the rare case one worker
        # took a whole round, another round follows (the total stays what was sent).
        for _ in range(MAX_ROUNDS):
            for _ in range(ROUND):
                with httpx.Client(base_url=base, timeout=10) as client:
                    answer = client.post("/finalize", json=record_for(f"r-{sent}"))
                assert answer.status_code == 200
                sent += 1
            served = {k: v for k, v in _finalizes_per_worker(metrics_dir).items() if v}
            if len(served) >= 2:
                break
        scrapes = [_scraped(base, "token_finalizer_finalize_total") for _ in range(6)]
        latencies = [
            _scraped(
                base, "token_finalizer_request_seconds_count", endpoint="/finalize", status="200"
            )
            for _ in range(3)
        ]
    assert process.returncode == 0
    assert len(served) >= 2, f"one worker served every request: {served}"
    assert sum(served.values()) == sent
    assert scrapes == [float(sent)] * 6
    assert latencies == [float(sent)] * 3
    # The directory lived as long as the server.
    assert not metrics_dir.exists()


def test_one_worker_keeps_single_process_metrics(tmp_path: Path, capture_dir: Path) -> None:
    """`serve` with one worker makes no metrics directory and still counts."""
    args, port, env, temp = _serve_command(tmp_path, capture_dir)
    base = f"http://127.0.0.1:{port}"
    with running_process(args, port=port, env=env):
        for i in range(3):
            httpx.post(f"{base}/finalize", json=record_for(f"one-{i}"), timeout=10)
        scraped = _scraped(base, "token_finalizer_finalize_total")
    assert scraped == 3.0
    assert list(temp.glob("token-finalizer-metrics-*")) == []


def test_multiprocess_directory_is_fresh_and_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the variable, the context sets it to a new empty directory, then unsets it
    and removes the directory."""
    monkeypatch.delenv(MULTIPROC_DIR_ENV_VAR, raising=False)
    with multiprocess_directory() as directory:
        inside = os.environ[MULTIPROC_DIR_ENV_VAR]
        empty = list(Path(directory).iterdir()) == []
        (Path(directory) / "counter_1.db").write_bytes(b"")
    assert (inside, empty) == (directory, True)
    assert MULTIPROC_DIR_ENV_VAR not in os.environ
    assert not Path(directory).exists()


def test_multiprocess_directory_of_the_operator_is_prepared_and_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the variable set, its directory is used: created, emptied of value files, kept."""
    operator = tmp_path / "operator"
    operator.mkdir()
    (operator / "counter_1.db").write_bytes(b"an earlier run")
    monkeypatch.setenv(MULTIPROC_DIR_ENV_VAR, str(operator))
    with multiprocess_directory() as directory:
        inside = (directory, sorted(Path(directory).iterdir()))
    assert inside == (str(operator), [])
    assert os.environ[MULTIPROC_DIR_ENV_VAR] == str(operator) and operator.is_dir()


def test_workers_share_one_retire_key_without_configuration(
    tmp_path: Path, capture_dir: Path
) -> None:
    """With no retire.key, a ticket minted by one worker retires on any other."""
    config = tmp_path / "config.yaml"
    config.write_text(f"sources:\n  local: {{kind: file, dir: '{capture_dir}'}}\n")
    store = FileTokenStore(capture_dir)

    async def write(rollout_id: str) -> None:
        for entry in agent_rollout(rollout_id, calls=2, new_tokens_per_turn=8):
            await store.put(entry)

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    args = ["serve", "--config", str(config), "--port", str(port), "--workers", "2"]
    with running_process(args, port=port):
        retired = []
        for i in range(12):  # fresh connections: finalize and retire land on either worker
            anyio.run(write, f"k-{i}")
            with httpx.Client(base_url=base, timeout=10) as client:
                answer = client.post("/finalize", json=record_for(f"k-{i}")).json()
            with httpx.Client(base_url=base, timeout=10) as client:
                retired.append(client.post("/retire", json=answer["retire"]).json())
    assert retired == [{"retired": True}] * 12
