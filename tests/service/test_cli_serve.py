"""`token-finalizer serve` as a real process: start-up, config errors, workers, SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio.to_thread
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.support.captures import record_for
from tests.support.logs import messages
from tests.support.servers import free_port, running_app, running_process
from tests.support.stores import stored_state
from token_finalizer import FileTokenStore


def _write_config(path: Path, capture_dir: Path) -> Path:
    path.write_text(f"sources:\n  local: {{kind: file, dir: {capture_dir}}}\n")
    return path


def _run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "token_finalizer.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def test_serve_answers_health(tmp_path: Path, capture_dir: Path) -> None:
    """The CLI starts uvicorn on the given port and /health answers ok."""
    config = _write_config(tmp_path / "config.yaml", capture_dir)
    port = free_port()
    with running_process(["serve", "--config", str(config), "--port", str(port)], port=port):
        response = httpx.get(f"http://127.0.0.1:{port}/health")
    assert response.json() == {"status": "ok"}


def test_serve_finalizes_from_the_configured_directory(
    tmp_path: Path, capture_dir: Path, file_store: FileTokenStore
) -> None:
    """A finalize through the served CLI freezes the capture in the configured directory."""
    config = _write_config(tmp_path / "config.yaml", capture_dir)
    port = free_port()
    with running_process(["serve", "--config", str(config), "--port", str(port)], port=port):
        httpx.post(f"http://127.0.0.1:{port}/finalize", json=record_for("cli-1"))
    assert stored_state(file_store, "cli-1").frozen is True


def test_config_path_from_the_environment(tmp_path: Path, capture_dir: Path) -> None:
    """Without --config, $TOKEN_FINALIZER_CONFIG names the configuration."""
    config = _write_config(tmp_path / "config.yaml", capture_dir)
    port = free_port()
    env = {"TOKEN_FINALIZER_CONFIG": str(config)}
    with running_process(["serve", "--port", str(port)], port=port, env=env):
        httpx.post(f"http://127.0.0.1:{port}/finalize", json=record_for("env-1"))
    assert stored_state(FileTokenStore(capture_dir), "env-1") is not None


def test_no_config_serves_the_embedded_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no configuration at all the service uses one file source in ./capture."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TOKEN_FINALIZER_CONFIG", raising=False)
    port = free_port()
    with running_process(["serve", "--port", str(port)], port=port):
        ready = httpx.get(f"http://127.0.0.1:{port}/ready").json()
    assert (list(ready["sources"]), (tmp_path / "capture").is_dir()) == (["local"], True)


def test_two_workers_serve_finalize(tmp_path: Path, capture_dir: Path) -> None:
    """With --workers 2 (factory mode) the workers load the same file and finalize."""
    config = _write_config(tmp_path / "config.yaml", capture_dir)
    port = free_port()
    args = ["serve", "--config", str(config), "--port", str(port), "--workers", "2"]
    with running_process(args, port=port):
        answer = httpx.post(f"http://127.0.0.1:{port}/finalize", json=record_for("w-1")).json()
    assert (answer["source"], stored_state(FileTokenStore(capture_dir), "w-1").frozen) == (
        "local",
        True,
    )


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_missing_retire_key_is_warned_once(
    tmp_path: Path, capture_dir: Path, workers: str
) -> None:
    """Without retire.key, one worker or two, the start logs the warning exactly once."""
    config = _write_config(tmp_path / "config.yaml", capture_dir)
    port, log = free_port(), tmp_path / "serve.log"
    args = ["serve", "--config", str(config), "--port", str(port), "--workers", workers]
    with running_process(args, port=port, log=log):
        pass
    assert log.read_text().count("retire.key is not configured") == 1


def test_invalid_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    """An invalid configuration exits with status 2 and names the key on stderr."""
    config = tmp_path / "config.yaml"
    config.write_text("limits:\n  max_body_bytes: -1\n")
    result = _run_cli("serve", "--config", str(config), "--port", str(free_port()))
    assert (result.returncode, "limits.max_body_bytes" in result.stderr) == (2, True)


def test_invalid_config_starts_no_server(tmp_path: Path) -> None:
    """An invalid configuration fails before uvicorn starts: stderr holds only the error."""
    config = tmp_path / "config.yaml"
    config.write_text("sources:\n  local: {kind: file}\n")
    result = _run_cli("serve", "--config", str(config), "--port", str(free_port()))
    assert messages(result.stderr).splitlines() == [
        "token-finalizer serve: invalid configuration: sources.local: a file source needs `dir`"
    ]


def test_missing_config_file_exits_2(tmp_path: Path) -> None:
    """A --config path that does not exist exits with status 2 naming the path."""
    result = _run_cli("serve", "--config", str(tmp_path / "absent.yaml"))
    assert (result.returncode, "absent.yaml" in result.stderr) == (2, True)


def test_zero_workers_is_a_usage_error() -> None:
    """--workers 0 is refused by the argument parser (status 2)."""
    result = _run_cli("serve", "--workers", "0")
    assert (result.returncode, "must be at least 1" in result.stderr) == (2, True)


class _GatedStore:
    """A protocol-v1 capture store whose freeze waits until the test opens the gate."""

    def __init__(self) -> None:
        self.freeze_started = threading.Event()
        self.gate = threading.Event()

    def app(self) -> Starlette:
        async def health(request: Request) -> JSONResponse:
            return JSONResponse({"status": "ok"})

        async def freeze(request: Request) -> JSONResponse:
            self.freeze_started.set()
            await anyio.to_thread.run_sync(self.gate.wait, 30)
            rollout_id = request.path_params["rollout_id"]
            snapshot = {
                "rollout_id": rollout_id,
                "entries": [],
                "incomplete": False,
                "snapshot_id": "gated",
                "version": 1,
            }
            return JSONResponse(snapshot)

        return Starlette(
            routes=[
                Route("/health", health),
                Route(
                    "/ng-rollout/{rollout_id}/training-token-capture/freeze",
                    freeze,
                    methods=["POST"],
                ),
            ]
        )


@pytest.fixture
def gated_store() -> Iterator[tuple[str, _GatedStore]]:
    """A gated capture store served on loopback: (base URL, store)."""
    store = _GatedStore()
    with running_app(store.app()) as base:
        try:
            yield base, store
        finally:
            store.gate.set()


def _refuses_connections(port: int) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0)
    except httpx.ConnectError:
        return True
    except httpx.HTTPError:
        return False
    return False


def test_sigterm_lets_an_in_flight_finalize_finish(
    tmp_path: Path, gated_store: tuple[str, _GatedStore]
) -> None:
    """After SIGTERM the server stops accepting, yet a finalize already in flight answers 200."""
    store_url, store = gated_store
    config = tmp_path / "config.yaml"
    config.write_text(f"sources:\n  remote: {{kind: http, url: '{store_url}'}}\n")
    port = free_port()
    answers: list[Any] = []

    def finalize() -> None:
        answers.append(
            httpx.post(f"http://127.0.0.1:{port}/finalize", json=record_for("slow"), timeout=60)
        )

    with running_process(
        ["serve", "--config", str(config), "--port", str(port)], port=port
    ) as proc:
        caller = threading.Thread(target=finalize)
        caller.start()
        assert store.freeze_started.wait(30), "the finalize never reached the capture store"
        proc.send_signal(signal.SIGTERM)
        while not _refuses_connections(port):
            time.sleep(0.02)  # shutdown has begun once new connections are refused
        store.gate.set()
        caller.join(60)
        proc.wait(30)
    assert (answers[0].status_code, answers[0].json()["rollout_id"]) == (200, "slow")
