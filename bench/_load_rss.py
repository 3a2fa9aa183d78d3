"""bench.load, the service's processes: RSS sampling and who served a connection.

Everything is read from /proc: the uvicorn parent's process tree (parent,
workers, multiprocessing's resource tracker), each process's VmRSS, and the
owner of the service's end of a loopback connection.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RSS_INTERVAL_S", "RssSample", "RssSampler", "serving_process", "wait_for_workers"]

RSS_INTERVAL_S = 0.5


def _children_by_scan(pid: int) -> list[int]:
    children = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{name}/status").read_text().splitlines():
                if line.startswith("PPid:"):
                    if int(line.split()[1]) == pid:
                        children.append(int(name))
                    break
    return children


def _children(pid: int) -> list[int]:
    """Direct children of `pid`: from /proc/PID/task/*/children, else by scanning /proc."""
    if not Path(f"/proc/self/task/{os.getpid()}/children").exists():
        return _children_by_scan(pid)
    children = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):  # the thread ended meanwhile
                children += [
                    int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()
                ]
    return children


def _rss_kib(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return None


def _role(pid: int, root: int) -> str:
    if pid == root:
        return "parent"
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    # multiprocessing's resource tracker, started along with uvicorn's spawned workers.
    return "tracker" if b"resource_tracker" in command else "worker"


def _server_socket_inode(server_port: int, client_port: int) -> int | None:
    """The inode of the service's end of our loopback connection, from /proc/net/tcp."""
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if (local_port, remote_port) == (server_port, client_port):
                return int(fields[9])
    return None


def serving_process(pids: list[int], server_port: int, client_port: int) -> int | None:
    """Which of `pids` holds the accepted end of the connection from `client_port`."""
    inode = _server_socket_inode(server_port, client_port)
    if inode is None:
        return None
    target = f"socket:[{inode}]"
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):  # closed meanwhile
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        return pid
    return None


@dataclass(frozen=True, slots=True)
class RssSample:
    """The RSS of every process of the service's tree at one moment."""

    at: float
    by_process: dict[int, tuple[str, int]]  # pid -> (role, KiB)

    @property
    def total_mb(self) -> float:
        return sum(kib for _, kib in self.by_process.values()) / 1024

    @property
    def workers(self) -> list[int]:
        return sorted(pid for pid, (role, _) in self.by_process.items() if role == "worker")

    def breakdown(self) -> str:
        order = {"parent": 0, "worker": 1}
        parts = sorted(
            self.by_process.items(), key=lambda item: (order.get(item[1][0], 2), item[0])
        )
        return ", ".join(f"{role} {pid} {kib / 1024:.0f}" for pid, (role, kib) in parts)


class RssSampler:
    """Samples the RSS of a process and all its descendants every RSS_INTERVAL_S, in a thread."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.samples: list[RssSample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def take(self) -> RssSample:
        """Sample now (also kept for the peak)."""
        pids, queue = [], [self.root]
        while queue:
            pid = queue.pop()
            pids.append(pid)
            queue += _children(pid)
        by_process = {}
        for pid in pids:
            kib = _rss_kib(pid)
            if kib is not None:
                by_process[pid] = (_role(pid, self.root), kib)
        sample = RssSample(time.perf_counter(), by_process)
        with self._lock:
            self.samples.append(sample)
        return sample

    def between(self, first: RssSample, last: RssSample) -> list[RssSample]:
        """The samples from `first` to `last` (both included), in time order."""
        with self._lock:
            window = [s for s in self.samples if first.at <= s.at <= last.at]
        return sorted(window, key=lambda sample: sample.at)

    def _run(self) -> None:
        while not self._stop.wait(RSS_INTERVAL_S):
            self.take()

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


def wait_for_workers(sampler: RssSampler, count: int, timeout: float = 20.0) -> list[int]:
    """The pids of the service's `count` worker processes, once they all exist."""
    deadline = time.monotonic() + timeout
    while len(workers := sampler.take().workers) < count:
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if len(workers) != count:
        raise RuntimeError(f"expected {count} worker processes, found {workers}")
    return workers
