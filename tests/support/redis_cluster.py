"""A real Redis Cluster for integration tests: `redis-server` processes on loopback.

    with RedisCluster(primaries=3, replicas=1) as cluster:
        client = redis.asyncio.RedisCluster.from_url(cluster.seed_urls[0])
        primary = cluster.node_for_key("{ng:r1}:state")
        cluster.reshard(1000, primary, other)     # also from a worker thread
        cluster.kill_primary(primary)
        promoted = cluster.wait_failover(primary)

Every node runs in its own directory under one temporary directory, on two
free loopback ports (clients, and the cluster bus via `cluster-port`, which
needs Redis 7 or later). The cluster is built with `redis-cli --cluster
create`, and `start()` returns only once every node reports `cluster_state:ok`,
all nodes agree on who serves which slot and every replica is in sync.
Leaving the block kills every process (paused ones too) and removes the
directory, whatever the test did; an `atexit` hook does the same if the block
is never left normally.

Topology is read from the nodes themselves (`CLUSTER NODES`), so `nodes()`
answers the current roles after a failover or a reshard; a `Node` is a
snapshot of one node at the moment it was read.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Self

import redis
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from tests.support.redis_processes import (
    HOST,
    RedisGroup,
    RedisProcess,
    check_redis_version,
    free_ports,
    needs_redis_server,
    plain_client,
    redis_server_available,
)

__all__ = [
    "Node",
    "RedisCluster",
    "needs_redis_server",
    "redis_server_available",
]

# Small enough for failovers within ~2-3 s, large enough that a busy 2-core
# machine does not flag healthy nodes as failing.
DEFAULT_NODE_TIMEOUT_MS = 1000
# How long the waits below poll before they give up with a description of
# what was still wrong.
DEFAULT_WAIT_S = 30.0
_POLL_S = 0.02
_MIN_REDIS_MAJOR = 7  # `cluster-port` came with Redis 7.0
# MIGRATE batch size of `redis-cli --cluster reshard` (keys per round trip).
_RESHARD_PIPELINE = 100
_START_ATTEMPTS = 3
_MIN_PRIMARIES = 3

Role = Literal["primary", "replica"]


@dataclass(frozen=True)
class Node:
    """One node as a cluster member saw it when `nodes()` was read."""

    node_id: str
    port: int
    role: Role
    primary_id: str | None
    slots: tuple[tuple[int, int], ...]
    failed: bool
    host: str = HOST

    @property
    def address(self) -> str:
        """`host:port`, the name redis-py and redis-cli give the node."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """A `redis://` URL of this node (usable as a cluster seed)."""
        return f"redis://{self.address}/0"

    @property
    def slot_count(self) -> int:
        """How many hash slots the node serves."""
        return sum(last - first + 1 for first, last in self.slots)

    def owns(self, slot: int) -> bool:
        """True when the node serves `slot`."""
        return any(first <= slot <= last for first, last in self.slots)


@dataclass
class RedisCluster(RedisGroup):
    """`primaries` x (1 + `replicas`) cluster nodes; a context manager that cleans up."""

    _root_prefix = "tf-redis-cluster-"

    primaries: int = 3
    replicas: int = 0
    appendonly: bool = False
    node_timeout_ms: int = DEFAULT_NODE_TIMEOUT_MS
    # False lets the slots of the live primaries keep serving while another
    # primary's slots are down (Redis's default, True, stops the whole cluster).
    require_full_coverage: bool = True
    _servers: dict[int, RedisProcess] = field(default_factory=dict, init=False)

    # -- life cycle ------------------------------------------------------------------

    def start(self) -> Self:
        """Start every node, create the cluster, and wait until it is ready."""
        if self.primaries < _MIN_PRIMARIES or self.replicas < 0:
            raise ValueError(
                f"a cluster needs >= {_MIN_PRIMARIES} primaries (redis-cli's minimum) "
                "and >= 0 replicas per primary"
            )
        check_redis_version(_MIN_REDIS_MAJOR)
        return super().start()

    def _launch(self, root: Path) -> None:
        self._start_processes(self.primaries * (1 + self.replicas))
        addresses = [f"{HOST}:{port}" for port in self._servers]
        _run_cli(
            "--cluster",
            "create",
            *addresses,
            "--cluster-replicas",
            str(self.replicas),
            "--cluster-yes",
        )
        self.wait_ready()

    def stop(self) -> None:
        """Kill every process we started (resuming paused ones first); remove the files."""
        super().stop()
        self._servers.clear()

    def _processes(self) -> list[RedisProcess]:
        return list(self._servers.values())

    def _start_processes(self, count: int) -> None:
        """Start `count` servers on free ports, choosing new ports if one is taken meanwhile."""
        assert self._root is not None
        for _ in range(_START_ATTEMPTS):
            ports = free_ports(2 * (count - len(self._servers)))
            for port, bus_port in zip(ports[::2], ports[1::2], strict=True):
                server = RedisProcess(
                    port,
                    self._root / str(port),
                    self._cluster_arguments(bus_port),
                    appendonly=self.appendonly,
                )
                self._servers[port] = server
                server.start()
            lost = [port for port, server in self._servers.items() if not server.answers()]
            for port in lost:
                self._servers.pop(port).kill()
            if not lost:
                return
        raise RuntimeError(f"could not start {count} redis-server processes on free ports")

    def _cluster_arguments(self, bus_port: int) -> list[str]:
        return [
            "--cluster-enabled",
            "yes",
            "--cluster-port",
            str(bus_port),
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(self.node_timeout_ms),
            # Any replica may take over, however long it was cut off (tests pause nodes).
            "--cluster-replica-validity-factor",
            "0",
            "--cluster-require-full-coverage",
            "yes" if self.require_full_coverage else "no",
        ]

    # -- topology ----------------------------------------------------------------------

    @property
    def directory(self) -> Path | None:
        """The temporary directory holding every node's files (None once stopped)."""
        return self._root

    @property
    def seed_urls(self) -> list[str]:
        """A `redis://` URL for every node we started (any of them is a valid seed)."""
        return [f"redis://{HOST}:{port}/0" for port in self._servers]

    def nodes(self) -> list[Node]:
        """Every member as seen by the first live node: primaries first, by port."""
        for server in self._live_servers():
            with contextlib.suppress(redis.RedisError):
                return _sorted(_parse_nodes(_cluster_nodes(server.port)))
        raise RuntimeError("no live node to ask for the cluster's topology")

    def primaries_now(self) -> list[Node]:
        """The primaries that serve slots and are not flagged as failed."""
        return [node for node in self.nodes() if node.role == "primary" and node.slots]

    def replicas_of(self, primary: Node) -> list[Node]:
        """The replicas that follow `primary`."""
        return [node for node in self.nodes() if node.primary_id == primary.node_id]

    def node_for_slot(self, slot: int) -> Node:
        """The primary serving `slot`."""
        for node in self.nodes():
            if node.role == "primary" and node.owns(slot):
                return node
        raise LookupError(f"no primary serves slot {slot}")

    def node_for_key(self, key: str | bytes) -> Node:
        """The primary serving `key` (its hash tag, when it has one, decides the slot)."""
        return self.node_for_slot(key_slot(key.encode() if isinstance(key, str) else key))

    def key_on(self, node: Node, label: str = "tf-key") -> str:
        """A key (`label{n}`) whose slot `node` serves, to address that node on purpose."""
        for number in range(REDIS_CLUSTER_HASH_SLOTS * 8):
            key = f"{label}{{{number}}}"
            if node.owns(key_slot(key.encode())):
                return key
        raise LookupError(f"{node.address} serves no slot")

    def client(self, node: Node) -> redis.Redis:
        """A plain client of one node (close it after use)."""
        return plain_client(node.port)

    # -- changes -------------------------------------------------------------------------

    def reshard(self, count: int, source: Node, target: Node) -> None:
        """Move `count` slots (and their keys) from `source` to `target`, then wait until ready.

        Runs `redis-cli --cluster reshard`, so it may be called from a worker
        thread while the test drives traffic; keys keep answering throughout
        (ASK and TRYAGAIN redirections while a slot moves).
        """
        _run_cli(
            "--cluster",
            "reshard",
            source.address,
            "--cluster-from",
            source.node_id,
            "--cluster-to",
            target.node_id,
            "--cluster-slots",
            str(count),
            "--cluster-pipeline",
            str(_RESHARD_PIPELINE),
            "--cluster-yes",
        )
        self.wait_ready()

    def rebalance(self) -> None:
        """Spread the slots evenly over the primaries again, then wait until ready."""
        any_node = next(self._live_servers())
        _run_cli(
            "--cluster",
            "rebalance",
            f"{HOST}:{any_node.port}",
            "--cluster-use-empty-masters",
            "--cluster-pipeline",
            str(_RESHARD_PIPELINE),
            "--cluster-yes",
        )
        self.wait_ready()

    def kill_primary(self, node: Node) -> None:
        """SIGKILL a primary (the snapshot `node` must show it as one)."""
        if node.role != "primary":
            raise ValueError(f"{node.address} is a {node.role}, not a primary")
        self.kill(node)

    def kill(self, node: Node) -> None:
        """SIGKILL any node; `restart` brings it back with its cluster configuration."""
        self._server(node).kill()

    def restart(self, node: Node, *, wait: bool = True) -> None:
        """Start a killed node again on its port and directory; wait until the cluster is ready.

        A primary that was failed over meanwhile comes back as a replica of the
        node that replaced it.
        """
        server = self._server(node)
        server.start()
        if not server.answers():
            raise RuntimeError(f"{node.address} did not come back: {server.log_tail()}")
        if wait:
            self.wait_ready()

    def pause(self, node: Node) -> None:
        """SIGSTOP a node: its connections stay open, it answers nothing (WAIT then times out)."""
        self._server(node).pause()

    def resume(self, node: Node, *, wait: bool = True) -> None:
        """SIGCONT a paused node; by default wait until the cluster is ready again."""
        self._server(node).resume()
        if wait:
            self.wait_ready()

    # -- waiting ---------------------------------------------------------------------------

    def wait_ready(self, timeout_s: float = DEFAULT_WAIT_S) -> None:
        """Wait until every live node is ok, all agree on the slots and the replicas are in sync."""
        _wait(self._readiness_problem, timeout_s, "cluster ready")

    def wait_failover(self, node: Node, timeout_s: float = DEFAULT_WAIT_S) -> Node:
        """Wait until a replica of the killed primary `node` serves its slots; the new primary.

        `node` is the snapshot taken before the kill (its slots say what must move).
        """
        if not node.slots:
            raise ValueError(f"{node.address} served no slots, nothing fails over")
        slot = node.slots[0][0]

        def problem() -> str | None:
            owner = self.node_for_slot(slot)
            if owner.node_id == node.node_id or not self._server(owner).live:
                return f"slot {slot} is still served by {owner.address}"
            return self._readiness_problem()

        _wait(problem, timeout_s, f"failover of {node.address}")
        return self.node_for_slot(slot)

    def wait_replicated(self, primary: Node, timeout_s: float = DEFAULT_WAIT_S) -> None:
        """Wait until every live replica of `primary` has all it had written when called.

        Compares replication offsets (INFO replication); a `WAIT` from another
        connection would not do, as it only counts that connection's writes.
        """
        with plain_client(primary.port) as client:
            offset = int(client.info("replication")["master_repl_offset"])
        replicas = [node for node in self.replicas_of(primary) if self._server(node).live]

        def problem() -> str | None:
            for replica in replicas:
                with plain_client(replica.port) as client:
                    reached = int(client.info("replication").get("slave_repl_offset", -1))
                if reached < offset:
                    return f"replica {replica.address} at offset {reached} of {offset}"
            return None

        _wait(problem, timeout_s, f"replication of {primary.address}")

    def _readiness_problem(self) -> str | None:
        """What keeps the cluster from being ready, or None."""
        views: dict[int, tuple[tuple[str, Role, str | None, tuple[tuple[int, int], ...]], ...]] = {}
        live = list(self._live_servers())
        live_ports = {server.port for server in live}
        for server in live:
            try:
                with plain_client(server.port) as client:
                    state = client.execute_command("CLUSTER", "INFO")
                    text = _cluster_nodes(server.port)
            except redis.RedisError as exc:
                return f"{HOST}:{server.port} does not answer: {exc}"
            if "cluster_state:ok" not in _text(state):
                return f"{HOST}:{server.port} is not cluster_state:ok"
            if "[" in text:
                return f"{HOST}:{server.port} sees a slot being migrated"
            members = _parse_nodes(text)
            for member in members:
                if member.port in live_ports and member.failed:
                    return f"{HOST}:{server.port} flags live node {member.address} as failing"
                if member.slots and member.port not in live_ports:
                    return f"{HOST}:{server.port} sees slots on the dead node {member.address}"
            views[server.port] = tuple(
                (m.node_id, m.role, m.primary_id, m.slots)
                for m in _sorted(members)
                if m.port in live_ports
            )
            served = sum(m.slot_count for m in members if m.role == "primary")
            if self.require_full_coverage and served != REDIS_CLUSTER_HASH_SLOTS:
                return f"{HOST}:{server.port} sees {served} slots served"
        if len(set(views.values())) > 1:
            return "the nodes do not agree on the topology yet"
        for node in self.nodes():
            if node.role == "replica" and node.port in live_ports:
                problem = _replication_problem(node.port)
                if problem:
                    return problem
        return None

    def _server(self, node: Node) -> RedisProcess:
        try:
            return self._servers[node.port]
        except KeyError:
            raise LookupError(f"{node.address} is not a node of this cluster") from None

    def _live_servers(self) -> Iterator[RedisProcess]:
        return (server for server in self._servers.values() if server.live)


# -- helpers -------------------------------------------------------------------------------

_NODE_LINE = re.compile(r"^(\S+) (\S+):(\d+)@\d+\S* (\S+) (\S+) \d+ \d+ \d+ \S+(.*)$")


def _parse_nodes(text: str) -> list[Node]:
    """`CLUSTER NODES` as Node snapshots (nodes still in handshake left out)."""
    found = []
    for line in text.splitlines():
        match = _NODE_LINE.match(line.strip())
        if match is None:
            continue
        node_id, host, port, flags, primary, slot_text = match.groups()
        flag_set = set(flags.split(","))
        if flag_set & {"handshake", "noaddr"}:
            continue
        found.append(
            Node(
                node_id=node_id,
                port=int(port),
                role="replica" if "slave" in flag_set else "primary",
                primary_id=None if primary == "-" else primary,
                slots=tuple(_slot_ranges(slot_text.split())),
                failed=bool(flag_set & {"fail", "fail?"}),
                host=host or HOST,
            )
        )
    return found


def _slot_ranges(items: Iterable[str]) -> Iterator[tuple[int, int]]:
    for item in items:
        if item.startswith("["):
            continue  # a slot being imported or migrated, still served by its owner
        first, _, last = item.partition("-")
        yield int(first), int(last or first)


def _sorted(nodes: list[Node]) -> list[Node]:
    return sorted(nodes, key=lambda node: (node.role != "primary", node.port))


def _replication_problem(port: int) -> str | None:
    try:
        with plain_client(port) as client:
            info = client.info("replication")
    except redis.RedisError as exc:
        return f"replica {HOST}:{port} does not answer: {exc}"
    if info.get("master_link_status") != "up" or info.get("master_sync_in_progress"):
        return f"replica {HOST}:{port} is not in sync with its primary"
    return None


def _cluster_nodes(port: int) -> str:
    with plain_client(port) as client:
        return _text(client.execute_command("CLUSTER", "NODES"))


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, dict):  # redis-py parses CLUSTER INFO into a dict
        return "\n".join(f"{key}:{item}" for key, item in value.items())
    return str(value)


def _wait(problem: Callable[[], str | None], timeout_s: float, what: str) -> None:
    """Poll `problem` until it answers None; TimeoutError naming the last problem."""
    deadline = time.monotonic() + timeout_s
    last: str | None = "never checked"
    while time.monotonic() < deadline:
        try:
            last = problem()
        except (redis.RedisError, LookupError, RuntimeError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        if last is None:
            return
        time.sleep(_POLL_S)
    raise TimeoutError(f"{what} not reached within {timeout_s} s: {last}")


def _run_cli(*args: str) -> str:
    """Run `redis-cli ARGS`; its output, or RuntimeError with the output's end."""
    result = subprocess.run(
        ["redis-cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    output = result.stdout + result.stderr
    if result.returncode != 0 or "[ERR]" in output:
        raise RuntimeError(
            f"redis-cli {' '.join(args[:2])} failed ({result.returncode}): {output[-2000:]}"
        )
    return output
