"""Slow and stalling clients against a real `serve` process: deadlines, the connection cap.

Each server runs with short deadlines ($TOKEN_FINALIZER_HEADER_TIMEOUT_S,
$TOKEN_FINALIZER_BODY_TIMEOUT_S) so the tests take seconds; the hostile
clients are raw sockets that send a request a byte at a time, or half of it
and then nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.servers import free_port, running_process
from token_finalizer._constants import (
    BODY_TIMEOUT_ENV_VAR,
    CONNECTION_FD_RESERVE,
    HEAD_TIMEOUT_ENV_VAR,
)

HEAD_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 2.0
# What a loaded CI machine may add to a deadline before the server acts on it.
SLACK_S = 3.0

_HALF_HEAD = b"POST /finalize HTTP/1.1\r\nHost: slow\r\nContent-Type: application/json\r\n"


@dataclass(frozen=True)
class Server:
    """A `serve` process on loopback."""

    host: str
    port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@contextlib.contextmanager
def _serving(
    tmp_path: Path,
    *,
    env: dict[str, str] | None = None,
    open_files: int | None = None,
    command: str = "serve",
) -> Iterator[Server]:
    """`token-finalizer serve` (or `store serve`) with the given environment and open-file limit."""
    directory = tmp_path / "capture"
    port = free_port()
    if command == "serve":
        config = tmp_path / "finalizer.yaml"
        config.write_text(
            yaml.safe_dump({"sources": {"local": {"kind": "file", "dir": str(directory)}}})
        )
        args = ["serve", "--config", str(config), "--port", str(port), "--drain-seconds", "0"]
    else:
        args = ["store", "serve", "--dir", str(directory), "--port", str(port)]

    def limit_open_files() -> None:
        if open_files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

    running = running_process(
        args, port=port, env=env, stop_signal=signal.SIGKILL, preexec_fn=limit_open_files
    )
    with running as process:
        yield Server("127.0.0.1", port, process)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A finalizer with 2 s deadlines for request heads and bodies."""
    env = {HEAD_TIMEOUT_ENV_VAR: str(HEAD_TIMEOUT_S), BODY_TIMEOUT_ENV_VAR: str(BODY_TIMEOUT_S)}
    with _serving(tmp_path_factory.mktemp("slow"), env=env) as running:
        yield running


def _health_latency(server: Server) -> float:
    """Seconds a fresh connection takes to get a 200 from /health."""
    started = time.monotonic()
    answer = httpx.get(f"{server.url}/health", timeout=10)
    assert answer.status_code == 200
    return time.monotonic() - started


async def _trickle(server: Server, data: bytes, *, interval_s: float) -> tuple[float, bytes]:
    """Send `data` a byte every `interval_s` until the server closes; (seconds, bytes received)."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    started = time.monotonic()
    received = b""
    try:
        for byte in data:
            try:
                writer.write(bytes([byte]))
                await writer.drain()
                chunk = await asyncio.wait_for(reader.read(65536), interval_s)
            except TimeoutError:
                continue
            except ConnectionError:
                break
            if not chunk:
                break
            received += chunk
            with contextlib.suppress(TimeoutError, ConnectionError):
                # The rest of the answer, then the end of the stream.
                while chunk := await asyncio.wait_for(reader.read(65536), SLACK_S):
                    received += chunk
            break
        else:
            raise AssertionError(f"the server took all {len(data)} bytes without closing")
    finally:
        writer.close()
    return time.monotonic() - started, received


def _half_sent(server: Server, count: int) -> list[socket.socket]:
    """`count` connections that sent half a request head and then nothing."""
    sockets = []
    for _ in range(count):
        sock = socket.create_connection((server.host, server.port), timeout=10)
        sock.sendall(_HALF_HEAD)
        sockets.append(sock)
    return sockets


def _health_answer(sock: socket.socket) -> bytes:
    """One whole answer of /health from `sock` (however the bytes are split)."""
    sock.settimeout(10)
    received = b""
    while b'{"status":"ok"}' not in received and (chunk := sock.recv(65536)):
        received += chunk
    return received


def _closed_by_server(sock: socket.socket, within_s: float) -> bytes:
    """What the server sent before closing `sock`; fails when it is open after `within_s`."""
    sock.settimeout(within_s)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        raise AssertionError(f"still open after {within_s} s; received {received!r}") from None
    return received


def _drip_until_answered(sock: socket.socket, data: bytes, interval_s: float) -> bytes:
    """Send `data` a byte every `interval_s` until the server answers or cuts the connection;
    what it answered (b"" when cut off or never)."""
    sock.settimeout(interval_s)
    for byte in data:
        try:
            sock.sendall(bytes([byte]))
            return sock.recv(65536)
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            break
    return b""


# -- request heads ----------------------------------------------------------------------------


def test_fifty_one_byte_per_second_heads_are_all_closed_in_time(server: Server) -> None:
    """50 clients sending their head a byte a second are answered 408 and closed at the deadline."""
    head = b"GET /health HTTP/1.1\r\nHost: slowloris\r\nX-Padding: " + b"a" * 200

    async def all_of_them() -> list[tuple[float, bytes]]:
        return await asyncio.gather(*(_trickle(server, head, interval_s=1.0) for _ in range(50)))

    results = asyncio.run(all_of_them())
    slowest = max(seconds for seconds, _ in results)
    assert slowest < HEAD_TIMEOUT_S + SLACK_S
    assert all(received.startswith(b"HTTP/1.1 408 ") for _, received in results)
    assert b"did not arrive within" in results[0][1]
    assert _health_latency(server) < 1.0


def test_health_answers_promptly_beside_200_half_sent_requests(server: Server) -> None:
    """200 stalled request heads do not slow /health down, and all of them are closed in time."""
    sockets = _half_sent(server, 200)
    try:
        latencies = [_health_latency(server) for _ in range(5)]
        assert max(latencies) < 1.0, latencies
        for sock in sockets:
            assert _closed_by_server(sock, HEAD_TIMEOUT_S + SLACK_S).startswith(b"HTTP/1.1 408 ")
    finally:
        for sock in sockets:
            sock.close()


def test_kept_alive_connection_trickling_its_next_head_is_closed(server: Server) -> None:
    """The deadline starts again after a response: a slow second head on the same connection."""
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _health_answer(sock).startswith(b"HTTP/1.1 200 ")
        started = time.monotonic()
        head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 200
        received = _drip_until_answered(sock, head, interval_s=1.0)
        assert time.monotonic() - started < HEAD_TIMEOUT_S + SLACK_S
        assert received == b"" or received.startswith(b"HTTP/1.1 408 ")


def test_idle_kept_alive_connection_outlives_the_head_deadline(server: Server) -> None:
    """Idling between requests is the keep-alive's business: a pause longer than the head
    deadline (but within the server's keep-alive) does not cost the connection."""
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(request)
        assert _health_answer(sock).startswith(b"HTTP/1.1 200 ")
        time.sleep(HEAD_TIMEOUT_S + 1.0)
        sock.sendall(request)
        assert _health_answer(sock).startswith(b"HTTP/1.1 200 ")


# -- request bodies ---------------------------------------------------------------------------


def test_trickling_body_gets_408_and_is_cut_off(server: Server) -> None:
    """A whole head, then a body at a byte every 0.5 s: 408 at the deadline, connection closed."""
    body = b'{"_ng_rollout_id": "trickle", "padding": "' + b"x" * 200 + b'"}'
    head = (
        b"POST /finalize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        sock.sendall(head)
        started = time.monotonic()
        received = _drip_until_answered(sock, body, interval_s=0.5)
        elapsed = time.monotonic() - started
        received += _closed_by_server(sock, SLACK_S)
    assert BODY_TIMEOUT_S - 0.5 < elapsed < BODY_TIMEOUT_S + SLACK_S
    assert received.startswith(b"HTTP/1.1 408 "), received[:200]
    assert b"connection: close" in received.lower()
    assert b"did not arrive in time" in received


def test_body_sent_promptly_is_not_affected(server: Server) -> None:
    """An ordinary finalize still answers 200 under the same deadlines."""
    answer = httpx.post(f"{server.url}/finalize", json={"_ng_rollout_id": "prompt"}, timeout=10)
    assert answer.status_code == 200


# -- the connection cap -----------------------------------------------------------------------


def test_low_open_file_limit_still_accepts_health_beside_300_half_sent_requests(
    tmp_path: Path,
) -> None:
    """256 open files and 300 stalled heads (the default 10 s deadline): /health still answers.

    The cap (open files minus CONNECTION_FD_RESERVE) is met before the
    descriptors run out, and a new connection displaces the longest-stalled one.
    """
    with _serving(tmp_path, open_files=256) as server:
        sockets = _half_sent(server, 300)
        try:
            latencies = [_health_latency(server) for _ in range(5)]
            assert max(latencies) < 1.0, latencies
            # The oldest were displaced to make room (closed without an answer).
            assert _closed_by_server(sockets[0], 1.0) == b""
        finally:
            for sock in sockets:
                sock.close()


def test_requests_beyond_the_cap_get_503_when_every_connection_is_busy(tmp_path: Path) -> None:
    """With every connection inside a request (bodies pending), one more request answers 503."""
    cap = 16
    env = {BODY_TIMEOUT_ENV_VAR: "30"}
    # The cap is half of what the open-file limit leaves beside CONNECTION_FD_RESERVE.
    with _serving(tmp_path, env=env, open_files=2 * cap + CONNECTION_FD_RESERVE) as server:
        busy = []
        try:
            for _ in range(cap - 1):
                sock = socket.create_connection((server.host, server.port), timeout=10)
                sock.sendall(
                    b"POST /finalize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 100\r\n\r\n{"
                )
                busy.append(sock)
            time.sleep(0.5)  # every request head is parsed: the app is waiting for bodies
            answer = httpx.get(f"{server.url}/health", timeout=10)
            assert answer.status_code == 503
            busy.pop().close()
            time.sleep(0.5)
            assert _health_latency(server) < 1.0
        finally:
            for sock in busy:
                sock.close()


def test_store_server_has_the_same_head_deadline(tmp_path: Path) -> None:
    """`store serve` runs the same protocol: a stalled head is answered 408 and closed."""
    env = {HEAD_TIMEOUT_ENV_VAR: str(HEAD_TIMEOUT_S)}
    with _serving(tmp_path, env=env, command="store") as server:
        (sock,) = _half_sent(server, 1)
        with sock:
            assert _closed_by_server(sock, HEAD_TIMEOUT_S + SLACK_S).startswith(b"HTTP/1.1 408 ")


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan"])
def test_invalid_deadline_override_stops_serve_with_status_2(tmp_path: Path, value: str) -> None:
    """A deadline override that is not a positive number of seconds is refused at start-up."""
    config = tmp_path / "finalizer.yaml"
    config.write_text(yaml.safe_dump({"sources": {"local": {"kind": "memory"}}}))
    result = subprocess.run(
        [sys.executable, "-m", "token_finalizer.cli", "serve", "--config", str(config)],
        env={**os.environ, HEAD_TIMEOUT_ENV_VAR: value},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert HEAD_TIMEOUT_ENV_VAR in result.stderr
