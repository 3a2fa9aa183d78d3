"""The HTTP protocol of both servers (web/protocol.py) and its limits (web/deadlines.py).

The protocol runs under uvicorn in a thread here, with a small connection
cap, so that which connection is displaced can be watched one by one; the
whole-process behaviour is tested against `serve` in
tests/integration/test_slow_clients.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import sys
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.support.servers import running_app
from token_finalizer._constants import (
    BODY_TIMEOUT_ENV_VAR,
    CONNECTION_FD_RESERVE,
    HEAD_TIMEOUT_ENV_VAR,
    MAX_ACCEPT_BACKLOG,
    MAX_CONNECTIONS,
    MIN_CONNECTIONS,
    REQUEST_BODY_TIMEOUT_S,
    REQUEST_HEAD_TIMEOUT_S,
)
from token_finalizer.api import create_app
from token_finalizer.settings import settings_from_mapping
from token_finalizer.web import deadlines
from token_finalizer.web.protocol import DeadlineH11Protocol, event_loop_factory, server_options
from token_finalizer_client._constants import STORE_KEEPALIVE_EXPIRY_S

CAP = 4
HALF_HEAD = b"GET /health HTTP/1.1\r\nHost: x\r\n"
WHOLE_HEAD = HALF_HEAD + b"\r\n"
# A whole request head, then the first byte of its body: the app waits for the rest.
BODY_PENDING = (
    b"POST /finalize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 50\r\n\r\n{"
)


# -- web/deadlines.py -------------------------------------------------------------------------


def test_deadlines_default_to_the_constants(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(HEAD_TIMEOUT_ENV_VAR, raising=False)
    monkeypatch.setenv(BODY_TIMEOUT_ENV_VAR, "  ")
    assert deadlines.request_head_timeout_s() == REQUEST_HEAD_TIMEOUT_S
    assert deadlines.request_body_timeout_s() == REQUEST_BODY_TIMEOUT_S


def test_deadlines_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HEAD_TIMEOUT_ENV_VAR, "2.5")
    monkeypatch.setenv(BODY_TIMEOUT_ENV_VAR, "90")
    assert (deadlines.request_head_timeout_s(), deadlines.request_body_timeout_s()) == (2.5, 90)


@pytest.mark.parametrize("value", ["0", "-3", "inf", "nan", "ten", "1e999"])
@pytest.mark.parametrize("variable", [HEAD_TIMEOUT_ENV_VAR, BODY_TIMEOUT_ENV_VAR])
def test_invalid_deadline_names_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=variable):
        deadlines.check_deadlines()
    with pytest.raises(ValueError, match=variable):
        server_options()


@pytest.mark.parametrize(
    ("open_files", "limits"),
    [
        (resource.RLIM_INFINITY, (MAX_CONNECTIONS, MAX_ACCEPT_BACKLOG)),
        (1_000_000, (MAX_CONNECTIONS, MAX_ACCEPT_BACKLOG)),
        (1024, ((1024 - CONNECTION_FD_RESERVE) // 2,) * 2),
        (256, (64, 64)),
        (64, (MIN_CONNECTIONS, MIN_CONNECTIONS)),
    ],
)
def test_connection_limits_fit_the_open_file_limit(
    monkeypatch: pytest.MonkeyPatch, open_files: int, limits: tuple[int, int]
) -> None:
    """Cap and backlog split what the open-file limit leaves beside the reserve."""
    monkeypatch.setattr(resource, "getrlimit", lambda _kind: (open_files, resource.RLIM_INFINITY))
    assert deadlines.connection_limits() == limits


def test_server_options_name_the_protocol_and_its_limits() -> None:
    options = server_options()
    assert options["http"] is DeadlineH11Protocol
    assert (options["limit_concurrency"], options["backlog"]) == deadlines.connection_limits()


def test_idle_connections_outlive_the_client_pools_expiry_by_far() -> None:
    """The server keeps an idle connection well past the client package's pool expiry, so a
    busy server never closes one that a pooled request was just sent on."""
    assert server_options()["timeout_keep_alive"] >= 4 * STORE_KEEPALIVE_EXPIRY_S


def test_server_options_let_uvicorn_pick_uvloop() -> None:
    """Servers run on uvicorn's "auto" loop: uvloop when it is installed."""
    assert server_options()["loop"] == "auto"


def test_event_loop_factory_makes_uvloop_loops_when_installed() -> None:
    """A server starting its own loop gets uvloop's, as uvicorn's "auto" would choose."""
    uvloop = pytest.importorskip("uvloop")
    factory = event_loop_factory()
    assert factory is not None
    loop = factory()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_event_loop_factory_falls_back_to_asyncio_without_uvloop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without uvloop (Windows, or not installed) the factory is None: asyncio's own loop."""
    monkeypatch.setitem(sys.modules, "uvloop", None)  # the import then raises ImportError
    assert event_loop_factory() is None
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        assert runner.run(asyncio.sleep(0, "ran")) == "ran"


# -- the protocol under uvicorn ---------------------------------------------------------------


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, int]]:
    """The finalizer over a memory source, with short deadlines and a cap of CAP connections."""
    monkeypatch.setenv(HEAD_TIMEOUT_ENV_VAR, "1")
    monkeypatch.setenv(BODY_TIMEOUT_ENV_VAR, "2")
    settings = settings_from_mapping({"sources": {"local": {"kind": "memory"}}}, env={})
    with running_app(create_app(settings), http=DeadlineH11Protocol, limit_concurrency=CAP) as url:
        parts = urlsplit(url)
        assert parts.hostname is not None and parts.port is not None
        yield parts.hostname, parts.port


def _connect(served: tuple[str, int], data: bytes = b"") -> socket.socket:
    sock = socket.create_connection(served, timeout=5)
    if data:
        sock.sendall(data)
    return sock


def _is_closed(sock: socket.socket, wait_s: float = 0.5) -> bool:
    """Whether the server closed `sock` (anything it sent first is read and dropped)."""
    sock.settimeout(wait_s)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def _health_on(sock: socket.socket) -> bytes:
    """Ask /health on `sock`; its whole answer (a 503 has another body: read to the end)."""
    sock.settimeout(5)
    sock.sendall(WHOLE_HEAD)
    received = b""
    with contextlib.suppress(ConnectionResetError):
        while b'{"status":"ok"}' not in received and (chunk := sock.recv(65536)):
            received += chunk
    return received


def test_a_new_connection_displaces_the_longest_stalled_one(served: tuple[str, int]) -> None:
    """At the cap, the connection that has waited longest for its head is closed, and only it."""
    stalled = []
    for _ in range(CAP - 1):
        stalled.append(_connect(served, HALF_HEAD))
        time.sleep(0.05)
    probe = _connect(served)  # the cap is reached: the oldest stalled connection goes
    try:
        assert _health_on(probe).startswith(b"HTTP/1.1 200 ")
        assert _is_closed(stalled[0])
        assert not any(_is_closed(sock, 0.1) for sock in stalled[1:])
    finally:
        for sock in [*stalled, probe]:
            sock.close()


def test_an_idle_kept_alive_connection_is_displaced_before_a_busy_one(
    served: tuple[str, int],
) -> None:
    """Connections inside a request are never displaced; idle ones are, oldest first."""
    idle = _connect(served)
    assert _health_on(idle).startswith(b"HTTP/1.1 200 ")
    busy = [_connect(served, BODY_PENDING) for _ in range(CAP - 2)]
    time.sleep(0.2)
    probe = _connect(served)
    try:
        assert _health_on(probe).startswith(b"HTTP/1.1 200 ")
        assert _is_closed(idle)
        # The busy ones got their 408 from the body deadline, not from the cap.
        for sock in busy:
            sock.settimeout(5)
            assert sock.recv(65536).startswith(b"HTTP/1.1 408 ")
    finally:
        for sock in [idle, *busy, probe]:
            sock.close()


def test_every_connection_busy_means_503(served: tuple[str, int]) -> None:
    """Nothing to displace: a request at the cap is answered 503 (uvicorn's), then closed."""
    busy = [_connect(served, BODY_PENDING) for _ in range(CAP - 1)]
    time.sleep(0.2)
    at_cap = _connect(served)
    try:
        assert _health_on(at_cap).startswith(b"HTTP/1.1 503 ")
        assert _is_closed(at_cap)
    finally:
        for sock in [*busy, at_cap]:
            sock.close()


def test_pipelined_requests_are_all_answered(served: tuple[str, int]) -> None:
    """Two requests in one write: two answers, and the connection stays usable."""
    with _connect(served, WHOLE_HEAD + WHOLE_HEAD) as sock:
        sock.settimeout(5)
        received = b""
        while received.count(b'{"status":"ok"}') < 2:
            received += sock.recv(65536)
        assert received.count(b"HTTP/1.1 200 ") == 2
        assert _health_on(sock).startswith(b"HTTP/1.1 200 ")


def test_stalled_head_gets_408_in_the_error_shape(served: tuple[str, int]) -> None:
    with _connect(served, HALF_HEAD) as sock:
        sock.settimeout(5)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head
    assert body == b'{"error":"the request line and headers did not arrive within 1 s"}'


def test_silent_connection_is_closed_at_the_deadline(served: tuple[str, int]) -> None:
    """A connection that never sends a byte is closed too (after its 408)."""
    with _connect(served) as sock:
        started = time.monotonic()
        assert _is_closed(sock, 5)
        assert 0.5 < time.monotonic() - started < 4
