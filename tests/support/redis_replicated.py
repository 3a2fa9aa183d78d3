"""One Redis primary and its replicas (no cluster) on loopback, for tests of `WAIT` and failures.

    with ReplicatedRedis(replica_count=1) as servers:
        client = redis.asyncio.Redis.from_url(servers.url)
        servers.pause(servers.replicas[0])     # WAIT 1 now times out
        servers.resume(servers.replicas[0])

`start()` returns once every replica is in sync with the primary; leaving
the block kills every process (paused ones too) and removes their files.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.support.redis_processes import HOST, RedisGroup, RedisProcess, free_ports, plain_client

__all__ = ["ReplicatedRedis"]

_WAIT_S = 30.0
_POLL_S = 0.02


@dataclass
class ReplicatedRedis(RedisGroup):
    """A primary and `replica_count` replicas following it; a context manager that cleans up."""

    _root_prefix = "tf-redis-replicated-"

    replica_count: int = 1
    appendonly: bool = False
    primary: RedisProcess | None = field(default=None, init=False)
    replicas: list[RedisProcess] = field(default_factory=list, init=False)

    @property
    def url(self) -> str:
        """The primary's `redis://` URL."""
        return self._primary().url

    def _launch(self, root: Path) -> None:
        """Start the primary, then its replicas; wait until they are in sync."""
        port, *replica_ports = free_ports(1 + self.replica_count)
        self.primary = RedisProcess(port, root / str(port), appendonly=self.appendonly)
        self._started(self.primary)
        for replica_port in replica_ports:
            replica = RedisProcess(
                replica_port,
                root / str(replica_port),
                ("--replicaof", HOST, str(port)),
                appendonly=self.appendonly,
            )
            self.replicas.append(replica)
            self._started(replica)
        self.wait_in_sync()

    def _processes(self) -> list[RedisProcess]:
        return [*self.replicas, *([self.primary] if self.primary else [])]

    def pause(self, process: RedisProcess) -> None:
        """SIGSTOP one server: it keeps its connections and acknowledges nothing."""
        process.pause()

    def resume(self, process: RedisProcess, *, wait: bool = True) -> None:
        """SIGCONT it; by default wait until every replica is in sync again."""
        process.resume()
        if wait:
            self.wait_in_sync()

    def kill(self, process: RedisProcess) -> None:
        """SIGKILL one server."""
        process.kill()

    def restart(self, process: RedisProcess, *, wait: bool = True) -> None:
        """Start a killed server again with its port and files; by default wait for sync."""
        self._started(process)
        if wait:
            self.wait_in_sync()

    def wait_in_sync(self, timeout_s: float = _WAIT_S) -> None:
        """Wait until the primary counts every live replica and each has finished its sync."""
        deadline = time.monotonic() + timeout_s
        problem: str | None = "never checked"
        while time.monotonic() < deadline:
            problem = self._sync_problem()
            if problem is None:
                return
            time.sleep(_POLL_S)
        raise TimeoutError(f"replicas not in sync within {timeout_s} s: {problem}")

    def _sync_problem(self) -> str | None:
        live = [replica for replica in self.replicas if replica.live]
        try:
            with plain_client(self._primary().port) as client:
                connected = int(client.info("replication").get("connected_slaves", 0))
            for replica in live:
                with plain_client(replica.port) as client:
                    info = client.info("replication")
                if info.get("master_link_status") != "up" or info.get("master_sync_in_progress"):
                    return f"replica {replica.address} is not in sync"
        except redis.RedisError as exc:
            return f"{type(exc).__name__}: {exc}"
        if connected < len(live):
            return f"the primary counts {connected} of {len(live)} replicas"
        return None

    def _primary(self) -> RedisProcess:
        if self.primary is None:
            raise RuntimeError("the servers are not started")
        return self.primary

    @staticmethod
    def _started(process: RedisProcess) -> None:
        process.start()
        if not process.answers():
            raise RuntimeError(f"{process.address} did not start: {process.log_tail()}")
