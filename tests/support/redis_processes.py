"""`redis-server` processes for integration tests: start, kill, pause, resume, restart.

The building block of `tests/support/redis_cluster.py` (cluster mode) and
`tests/support/redis_replicated.py` (one primary and its replicas). Each
process runs in its own directory, on a loopback port chosen free, with no
RDB snapshots; it is started again with the same arguments, port and files.
"""

from __future__ import annotations

import atexit
import contextlib
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

import pytest
import redis

__all__ = [
    "HOST",
    "RedisGroup",
    "RedisProcess",
    "check_redis_version",
    "free_ports",
    "needs_redis_server",
    "plain_client",
    "redis_server_available",
]

HOST = "127.0.0.1"
_POLL_S = 0.02
_CLIENT_TIMEOUT_S = 2.0
_ANSWER_WAIT_S = 10.0


def redis_server_available() -> bool:
    """True when both `redis-server` and `redis-cli` are on PATH (skip reason otherwise)."""
    return shutil.which("redis-server") is not None and shutil.which("redis-cli") is not None


# The mark of every test module that starts redis-server processes of its own.
needs_redis_server = pytest.mark.skipif(
    not redis_server_available(), reason="redis-server and redis-cli are not on PATH"
)


def check_redis_version(minimum_major: int) -> None:
    """RuntimeError unless `redis-server` is at least version `minimum_major`."""
    output = subprocess.run(
        ["redis-server", "--version"], capture_output=True, text=True, check=True
    ).stdout
    match = re.search(r"v=(\d+)\.", output)
    if match is None or int(match.group(1)) < minimum_major:
        raise RuntimeError(f"these tests need redis-server {minimum_major} or later: {output}")


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports that were free a moment ago."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((HOST, 0))
        return [sock.getsockname()[1] for sock in sockets]


def plain_client(port: int) -> redis.Redis:
    """A short-timeout client of one server, answers decoded (close it after use)."""
    return redis.Redis(
        host=HOST,
        port=port,
        socket_timeout=_CLIENT_TIMEOUT_S,
        socket_connect_timeout=_CLIENT_TIMEOUT_S,
        decode_responses=True,
    )


@dataclass
class RedisProcess:
    """One `redis-server` on `port`, with `arguments` added to the common ones."""

    port: int
    directory: Path
    arguments: Sequence[str] = ()
    appendonly: bool = False
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    paused: bool = field(default=False, init=False)

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def url(self) -> str:
        return f"redis://{self.address}/0"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def live(self) -> bool:
        """Running and not stopped with SIGSTOP: it can answer."""
        return self.running and not self.paused

    def start(self) -> None:
        """Start the server (again); its directory keeps its files across restarts."""
        if self.running:
            raise RuntimeError(f"{self.address} is already running")
        self.directory.mkdir(parents=True, exist_ok=True)
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always"]
            if self.appendonly
            else ["--appendonly", "no"]
        )
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--bind",
                HOST,
                "--port",
                str(self.port),
                "--save",
                "",
                *persistence,
                # A replica's first sync starts at once instead of after 5 s.
                "--repl-diskless-sync-delay",
                "0",
                "--dir",
                str(self.directory),
                "--logfile",
                "redis.log",
                *self.arguments,
            ],
            cwd=self.directory,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.paused = False

    def answers(self, timeout_s: float = _ANSWER_WAIT_S) -> bool:
        """Wait until the server answers PING; False if it exited (its port was taken)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.running:
                return False
            with contextlib.suppress(redis.RedisError), plain_client(self.port) as client:
                if client.ping():
                    return True
            time.sleep(_POLL_S)
        return False

    def kill(self) -> None:
        """SIGKILL (a paused server is resumed first so that it can die); idempotent."""
        process = self.process
        if process is not None and process.poll() is None:
            if self.paused:
                process.send_signal(signal.SIGCONT)
            process.kill()
            process.wait()
        self.paused = False

    def pause(self) -> None:
        """SIGSTOP: its connections stay open and it answers nothing."""
        if not self.running:
            raise RuntimeError(f"{self.address} is not running")
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT after `pause`."""
        if self.process is not None and self.paused and self.running:
            self.process.send_signal(signal.SIGCONT)
        self.paused = False

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.directory / "redis.log").read_text()[-2000:]
        return "(no log)"


class RedisGroup:
    """The life cycle of several servers under one temporary directory; a context manager.

    A subclass starts its servers in `_launch(root)` and names them in `_processes()`.
    `start()` undoes a half-done launch; `stop()` (also run at exit if the block is
    never left) kills every server, paused ones too, and removes the directory.
    """

    _root_prefix: ClassVar[str] = "tf-redis-"
    _root: Path | None = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> Self:
        """Make the directory, then launch; on any failure, stop before raising."""
        self._root = Path(tempfile.mkdtemp(prefix=self._root_prefix))
        atexit.register(self.stop)
        try:
            self._launch(self._root)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill every process (resuming paused ones first); remove the files."""
        atexit.unregister(self.stop)
        for process in self._processes():
            process.kill()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def _launch(self, root: Path) -> None:
        raise NotImplementedError

    def _processes(self) -> Iterable[RedisProcess]:
        raise NotImplementedError
