"""The sides the hot-path bench compares, each as a NeMo Gym 0.7 model server would hold it.

- `standin_side`: the in-process baseline, `bench/_gym_baseline.py` (0.7's file
  store + file lineage store) over a temporary directory.
- `served_side`: `token-finalizer store serve` over a temporary directory or
  a Redis key prefix, a real process on a free loopback port, driven through
  the client's `HttpTokenSink` and `HttpLineageResolver` (one of each, shared
  by every rollout, as one model-server worker builds them from its config).
  With a profile path, py-spy samples the store server for the whole run;
  with `env`, the server runs with those variables too (the `OTEL_*` of
  `--tracing sdk`, bench/_hotpath_tracing.py).

Both stamp entries with the same writer code (`stamp_entry`): only the store
operations differ.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from bench._gym_baseline import GymStyleFileStore, GymStyleLineageStore, stamp_entry
from bench._hotpath_workload import ModelCall
from tests.support.redis import unique_prefix
from tests.support.servers import free_port, running_process
from token_finalizer_client import HttpLineageResolver, HttpTokenSink

__all__ = ["BACKENDS", "HttpSide", "StandInSide", "served_side", "standin_side"]

BACKENDS = ("dir", "redis")
# Generous: a resolve that times out answers `unresolved`, which fails the bench loudly.
_CLIENT_TIMEOUT_S = 300.0
_PROFILE_RATE_HZ = 100
_PROFILER_STOP_S = 60.0


class StandInSide:
    """NeMo Gym 0.7's in-process capture path, as `bench/_gym_baseline.py` re-implements it."""

    def __init__(self, root: Path) -> None:
        self._store = GymStyleFileStore(root)
        self._lineage = GymStyleLineageStore(self._store)

    async def resolve(self, rollout_id: str, request_items: list[dict[str, Any]]) -> Any:
        return await self._lineage.resolve(rollout_id, request_items)

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        await self._store.begin_call(rollout_id, model_call_id)

    def entry(self, call: ModelCall, resolution: Any, delta: bool) -> Any:
        return stamp_entry(call, resolution, delta)

    async def put(self, entry: Any) -> None:
        await self._store.put(entry)


class HttpSide:
    """Our store server through the client, as a 0.7 model server configured with our sink.

    With the server's process id, `server_cpu_s` reads the CPU time it has used.
    """

    def __init__(self, url: str, server_pid: int | None = None) -> None:
        self._sink = HttpTokenSink(url=url, timeout=_CLIENT_TIMEOUT_S)
        self._resolver = HttpLineageResolver(url=url, timeout=_CLIENT_TIMEOUT_S)
        self._server_pid = server_pid

    def server_cpu_s(self) -> float | None:
        """User + system CPU seconds of the store server process so far (None: unknown)."""
        if self._server_pid is None:
            return None
        return _cpu_seconds(self._server_pid)

    async def resolve(self, rollout_id: str, request_items: list[dict[str, Any]]) -> Any:
        return await self._resolver.resolve(rollout_id, request_items)

    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        await self._sink.begin_call(rollout_id, model_call_id)

    def entry(self, call: ModelCall, resolution: Any, delta: bool) -> Any:
        return stamp_entry(call, resolution, delta)

    async def put(self, entry: Any) -> None:
        await self._sink.put(entry)

    async def close(self) -> None:
        await self._sink.close()
        await self._resolver.close()


def _cpu_seconds(pid: int) -> float | None:
    """utime + stime of process `pid` from /proc (Linux), None where it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def standin_side() -> Iterator[StandInSide]:
    with tempfile.TemporaryDirectory(prefix="hotpath-standin-") as directory:
        yield StandInSide(Path(directory))


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise RuntimeError("--profile needs py-spy (pip install py-spy into the venv)")
    return found


@contextlib.contextmanager
def _profiled(pid: int, output: Path | None) -> Iterator[None]:
    """py-spy samples process `pid` (all its threads, without pausing it) into `output`."""
    if output is None:
        yield
        return
    command = [_py_spy(), "record", "--pid", str(pid), "--rate", str(_PROFILE_RATE_HZ)]
    command += ["--nonblocking", "--format", "raw", "--output", str(output)]
    profiler = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        profiler.send_signal(signal.SIGINT)  # py-spy writes its samples, then exits
        try:
            profiler.wait(timeout=_PROFILER_STOP_S)
        except subprocess.TimeoutExpired:
            profiler.kill()
            profiler.wait()


@contextlib.contextmanager
def _store_server(
    backend: str, redis_url: str, profile: Path | None, env: dict[str, str] | None
) -> Iterator[tuple[str, int]]:
    """`token-finalizer store serve` over a fresh directory or key prefix; its URL and pid."""
    port = free_port()
    serve = ["store", "serve", "--port", str(port)]
    with contextlib.ExitStack() as stack:
        if backend == "dir":
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="hotpath-dir-"))
            serve += ["--dir", directory]
        elif backend == "redis":
            prefix = stack.enter_context(unique_prefix(redis_url, "hotpath"))
            serve += ["--redis", redis_url, "--key-prefix", prefix]
        else:
            raise ValueError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
        process = stack.enter_context(running_process(serve, port=port, env=env))
        stack.enter_context(_profiled(process.pid, profile))
        yield f"http://127.0.0.1:{port}", process.pid


@contextlib.asynccontextmanager
async def served_side(
    backend: str,
    redis_url: str,
    profile: Path | None = None,
    env: dict[str, str] | None = None,
) -> AsyncIterator[HttpSide]:
    """A fresh store server for `backend` and the client side that writes through it."""
    with _store_server(backend, redis_url, profile, env) as (url, pid):
        side = HttpSide(url, pid)
        try:
            yield side
        finally:
            await side.close()
