"""Helpers shared by the benchmarks: the CLI server as a subprocess, raw HTTP/1.1, staged chains.

The load generators speak HTTP/1.1 over asyncio streams rather than through
httpx so that they cost the shared 2 cores as little as possible.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from tests.support.captures import record_for
from tests.support.servers import free_port, stop_process, wait_for_health
from token_finalizer.core.staging import StagedCallRecord, build_staged_call

__all__ = [
    "RawResponse",
    "ServiceProcess",
    "finalize_request",
    "post_request",
    "read_answer",
    "read_response",
    "running_service",
    "serving",
    "staged_chain",
]

# uvicorn waits up to 30 s for in-flight requests on SIGTERM (GRACEFUL_SHUTDOWN_S).
STOP_TIMEOUT_S = 40.0


@dataclass(frozen=True, slots=True)
class ServiceProcess:
    """A running `token-finalizer serve`: its base URL, port and the uvicorn parent's pid."""

    base: str
    port: int
    pid: int


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM the uvicorn parent (it stops its workers), then SIGKILL whatever is left.

    The server runs in its own session, so its process group holds the workers
    too: none can outlive the benchmark, even if the parent dies first.
    """
    stop_process(process, timeout=STOP_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


@contextlib.contextmanager
def running_service(
    capture_dir: Path, workers: int, *, stderr_path: Path | None = None
) -> Iterator[ServiceProcess]:
    """`token-finalizer serve` over a file source in `capture_dir`, as a process group.

    Request log lines (stdout) are produced as in production, then discarded;
    the service's own log (stderr) goes to `stderr_path` when given.
    """
    config = capture_dir.parent / f"config-{capture_dir.name}.yaml"
    config.write_text(f"sources:\n  local: {{kind: file, dir: '{capture_dir}'}}\n")
    port = free_port()
    command = [sys.executable, "-m", "token_finalizer.cli", "serve", "--config", str(config)]
    command += ["--port", str(port), "--workers", str(workers)]
    with contextlib.ExitStack() as stack:
        stderr = (
            subprocess.DEVNULL
            if stderr_path is None
            else stack.enter_context(stderr_path.open("wb"))
        )
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True
        )
        stack.callback(_stop, process)
        base = f"http://127.0.0.1:{port}"
        wait_for_health(base + "/health", process=process)
        yield ServiceProcess(base, port, process.pid)


@contextlib.contextmanager
def serving(capture_dir: Path, workers: int) -> Iterator[str]:
    """`token-finalizer serve` over `capture_dir` as a subprocess; yields its base URL."""
    with running_service(capture_dir, workers) as service:
        yield service.base


# -- raw HTTP/1.1 ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RawResponse:
    """One HTTP answer: status, headers (lower-case names) and the body as sent."""

    status: int
    headers: dict[str, str]
    body: bytes


def post_request(port: int, path: str, body: bytes, *, accept_encoding: str | None = None) -> bytes:
    """A keep-alive `POST path` with a JSON body, as bytes ready to write."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    )
    if accept_encoding is not None:
        head += f"Accept-Encoding: {accept_encoding}\r\n"
    return (head + "\r\n").encode() + body


def finalize_request(port: int, rollout_id: str, *, accept_encoding: str | None = None) -> bytes:
    """`POST /finalize` of a finished record naming `rollout_id`."""
    body = orjson.dumps(record_for(rollout_id))
    return post_request(port, "/finalize", body, accept_encoding=accept_encoding)


async def read_response(reader: asyncio.StreamReader) -> RawResponse:
    """Read one Content-Length framed answer (the service never sends chunked ones)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name:
            headers[name.strip().lower().decode()] = value.strip().decode()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return RawResponse(status, headers, body)


async def read_answer(reader: asyncio.StreamReader) -> int:
    """Read one answer; only its status is kept."""
    return (await read_response(reader)).status


def staged_chain(
    rollout_id: str,
    calls: int,
    carry: int,
    generated: int,
    *,
    seed: int,
    weight_version: int | None = None,
    float32_log_probs: bool = False,
) -> list[StagedCallRecord]:
    """`calls` chained staged calls, root first, each `carry` new prompt tokens on the last.

    Each call generates `generated` tokens with log probabilities (random ids
    below 150 000 from `seed`; each log prob exactly a float32 with
    `float32_log_probs`, as an engine sampling in float32 reports them); its
    weight version is `weight_version`, or a new one every 100 calls when None.
    """
    rng = np.random.default_rng(seed)
    prompt = np.empty(0, dtype=np.int64)
    parent: StagedCallRecord | None = None
    staged = []
    for index in range(calls):
        prompt = np.concatenate([prompt, rng.integers(0, 150_000, carry)])
        output = rng.integers(0, 150_000, generated)
        log_probs = -rng.random(generated)
        if float32_log_probs:
            log_probs = log_probs.astype(np.float32).astype(np.float64)
        record = build_staged_call(
            rollout_id=rollout_id,
            model_call_id=f"call-{index:04d}",
            parent=parent,
            prompt_token_ids=prompt,
            generated_token_ids=output,
            generated_log_probs=log_probs,
            weight_version=index // 100 if weight_version is None else weight_version,
        )
        prompt = np.concatenate([prompt, output])
        staged.append(record)
        parent = record
    return staged
