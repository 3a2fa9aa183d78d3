"""Real servers on loopback for integration tests.

`running_app` serves an ASGI app under uvicorn in a background thread;
`running_process` starts a CLI command as a subprocess and waits for its health
URL. Both pick a free port and always shut the server down.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import uvicorn

__all__ = ["free_port", "running_app", "running_process", "stop_process", "wait_for_health"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process(
    process: subprocess.Popen, *, stop_signal: int = signal.SIGTERM, timeout: float = 15.0
) -> None:
    """Send `stop_signal` unless it has exited; SIGKILL it if it is still there after `timeout`."""
    if process.poll() is not None:
        return
    process.send_signal(stop_signal)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_for_health(
    url: str, *, timeout: float = 20.0, process: subprocess.Popen | None = None
) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode} before it was healthy")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"{url} not healthy after {timeout}s: {last}")


@contextlib.contextmanager
def running_app(app: Any, *, health_path: str = "/health", **config: Any) -> Iterator[str]:
    """Serve `app` with uvicorn on 127.0.0.1; yield its base URL."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", **config
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(base + health_path)
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=15)


@contextlib.contextmanager
def running_process(
    args: list[str],
    *,
    port: int,
    health_path: str = "/health",
    env: dict[str, str] | None = None,
    log: Path | None = None,
    stop_signal: int = signal.SIGINT,
    preexec_fn: Callable[[], None] | None = None,
    cwd: Path | None = None,
    wrapper: Sequence[str] = (),
) -> Iterator[subprocess.Popen]:
    """Run `python -m token_finalizer.cli ARGS` (in `cwd`) until the block ends; yield the process.

    `wrapper` is a command that execs the rest in the same process (`prlimit --as=N`).

    Its output goes to `log`, or to a temporary file (a pipe nobody reads would
    block a chatty server), and is shown if the server never becomes healthy.
    The process is stopped with `stop_signal`; the default SIGINT skips the
    SIGTERM drain window.
    """
    with log.open("w+b") if log is not None else tempfile.TemporaryFile() as output:
        process = subprocess.Popen(
            [*wrapper, sys.executable, "-m", "token_finalizer.cli", *args],
            env={**os.environ, **(env or {})},
            stdout=output,
            stderr=subprocess.STDOUT,
            preexec_fn=preexec_fn,
            cwd=cwd,
        )
        try:
            try:
                wait_for_health(f"http://127.0.0.1:{port}{health_path}", process=process)
            except (RuntimeError, TimeoutError) as exc:
                output.seek(0)
                raise RuntimeError(
                    f"{exc}; its output:\n{output.read().decode()[-4000:]}"
                ) from None
            yield process
        finally:
            stop_process(process, stop_signal=stop_signal)
