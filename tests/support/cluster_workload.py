"""Writers and finalizers against a Redis Cluster behind real servers, and what they were told.

Used by the reshard and failover tests (tests/integration/test_redis_cluster_*.py)
and by `bench/cluster.py`:

- `serving(cluster, directory, ...)` runs `store serve --redis-cluster` and a
  finalizer (`serve`) with two sources on the same keys: `store` (http, via
  the store server) and `direct` (a redis cluster source);
- `Workload.run(...)`: each worker writes small rollouts through the store
  server (3 calls, each a put), finalizes them (alternating the two sources)
  and retires every other one, until told to stop. Every answer is counted
  by status; everything acknowledged goes into the `Ledger`;
- `reshard_during(...)`, `failover_during(...)`: the workload around one fault;
- `lost(ledger, store)` reads the cluster afterwards: every acknowledged
  put, freeze and retire must be there.

With `retry_policy`, calls are repeated as the client package repeats them
(503 + Retry-After); without, every answer is final, so any 5xx is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.captures import agent_rollout, record_for
from tests.support.redis_cluster import RedisCluster
from tests.support.servers import free_port, running_process
from token_finalizer.sources.redis import RedisTokenStore
from token_finalizer_client.transport import RetryPolicy

__all__ = [
    "Ledger",
    "Topology",
    "Workload",
    "failover_during",
    "lost",
    "reshard_during",
    "serving",
]

RETIRE_KEY = "cluster-workload-retire-key-0123456789abcdef"
CALLS = 3
SOURCES = ("store", "direct")


@dataclass(frozen=True)
class Topology:
    """The running servers and where their keys live."""

    store: str
    finalizer: str
    seeds: list[str]
    prefix: str

    def open_store(self, timeout_s: float = 30.0) -> RedisTokenStore:
        """A cluster store on the same keys (the caller closes it)."""
        return RedisTokenStore(
            urls=self.seeds, cluster=True, key_prefix=self.prefix, timeout_s=timeout_s
        )


def _config(store_url: str, seeds: list[str], prefix: str, replicas: int, timeout_s: float) -> str:
    urls = ", ".join(f'"{seed}"' for seed in seeds)
    return f"""\
sources:
  default: store
  store: {{kind: http, url: "{store_url}", timeout_s: 30}}
  direct:
    kind: redis
    urls: [{urls}]
    cluster: true
    key_prefix: "{prefix}"
    timeout_s: {timeout_s}
    min_replicas_acked: {replicas}
retire:
  key: "{RETIRE_KEY}"
"""


@contextlib.contextmanager
def serving(
    cluster: RedisCluster,
    directory: Path,
    *,
    prefix: str,
    min_replicas_acked: int = 0,
    redis_timeout_s: float = 5.0,
    finalizer_workers: int = 1,
) -> Iterator[Topology]:
    """`store serve` on the cluster and a finalizer on it, until the block ends."""
    seeds = cluster.seed_urls
    store_port, finalizer_port = free_port(), free_port()
    store_url = f"http://127.0.0.1:{store_port}"
    config = directory / "finalizer.yaml"
    config.write_text(_config(store_url, seeds, prefix, min_replicas_acked, redis_timeout_s))
    store_args = ["store", "serve", "--redis-cluster", "--key-prefix", prefix]
    for seed in seeds[:2]:  # two seeds: either one may be the node that dies
        store_args += ["--redis", seed]
    store_args += ["--redis-timeout", str(redis_timeout_s), "--port", str(store_port)]
    store_args += ["--min-replicas-acked", str(min_replicas_acked)]
    serve_args = ["serve", "--config", str(config), "--port", str(finalizer_port)]
    if finalizer_workers > 1:
        serve_args += ["--workers", str(finalizer_workers)]
    with (
        running_process(store_args, port=store_port),
        running_process(serve_args, port=finalizer_port, health_path="/ready"),
    ):
        yield Topology(store_url, f"http://127.0.0.1:{finalizer_port}", seeds, prefix)


@dataclass
class Ledger:
    """What the servers acknowledged, and every answer's status."""

    puts: dict[str, list[str]] = field(default_factory=dict)  # rollout -> acknowledged call ids
    frozen: dict[str, tuple[str, int]] = field(default_factory=dict)  # -> (snapshot id, version)
    retired: set[str] = field(default_factory=set)
    statuses: Counter[int] = field(default_factory=Counter)
    retry_after: Counter[str] = field(default_factory=Counter)  # of 5xx answers
    problems: list[str] = field(default_factory=list)  # answers that contradict the contract
    latencies: dict[str, list[float]] = field(default_factory=dict)  # operation -> seconds

    def answered(self, operation: str, answer: httpx.Response, seconds: float) -> None:
        self.statuses[answer.status_code] += 1
        if answer.status_code >= 500:
            self.retry_after[answer.headers.get("retry-after", "(none)")] += 1
        self.latencies.setdefault(operation, []).append(seconds)

    @property
    def server_errors(self) -> int:
        """Answers with a 5xx status."""
        return sum(count for status, count in self.statuses.items() if status >= 500)


class Workload:
    """`workers` coroutines writing, finalizing and retiring small rollouts."""

    def __init__(
        self, topology: Topology, *, workers: int = 16, retry_policy: RetryPolicy | None = None
    ) -> None:
        self.topology = topology
        self.workers = workers
        self.retry_policy = retry_policy
        self.ledger = Ledger()
        # Rollout ids of this run alone: several runs may share one topology.
        self.label = uuid.uuid4().hex[:6]

    async def _call(
        self, operation: str, send: Callable[[], Awaitable[httpx.Response]]
    ) -> httpx.Response:
        async def timed() -> httpx.Response:
            started = time.perf_counter()
            answer = await send()
            self.ledger.answered(operation, answer, time.perf_counter() - started)
            return answer

        if self.retry_policy is None:
            return await timed()
        return await self.retry_policy.acall(timed)

    async def _rollout(
        self, http: httpx.AsyncClient, rollout_id: str, source: str, *, retire: bool
    ) -> None:
        ledger = self.ledger
        for entry in agent_rollout(rollout_id, calls=CALLS, new_tokens_per_turn=12):
            call_id = entry["model_call_id"]
            path = f"{self.topology.store}/ng-rollout/{rollout_id}/training-token-capture"
            url = f"{path}/calls/{call_id}"
            answer = await self._call("put", lambda url=url, entry=entry: http.put(url, json=entry))
            if answer.status_code != 200:
                return  # not acknowledged: the rollout stops here
            ledger.puts.setdefault(rollout_id, []).append(call_id)
        answer = await self._call(
            "finalize",
            lambda: http.post(
                f"{self.topology.finalizer}/finalize",
                params={"source": source},
                json=record_for(rollout_id),
            ),
        )
        if answer.status_code != 200:
            return
        body = answer.json()
        build = body["build"]
        if build["mask_sample"] or build["metrics"].get("n_calls") != CALLS:
            ledger.problems.append(f"{rollout_id} via {source}: {build}")
            return
        ledger.frozen[rollout_id] = (body["retire"]["snapshot_id"], body["retire"]["version"])
        if not retire:
            return  # this one stays frozen, as evidence not yet consumed
        answer = await self._call(
            "retire",
            lambda: http.post(f"{self.topology.finalizer}/retire", json=body["retire"]),
        )
        if answer.status_code == 200 and answer.json() == {"retired": True}:
            ledger.retired.add(rollout_id)
        elif answer.status_code < 500:
            ledger.problems.append(f"{rollout_id}: retire answered {answer.status_code}")

    async def _worker(self, number: int, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=120) as http:
            rollout = 0
            while not stop.is_set():
                rollout_id = f"{self.label}-w{number}-{rollout}"
                source = SOURCES[rollout % 2]
                await self._rollout(http, rollout_id, source, retire=rollout // 2 % 2 == 0)
                rollout += 1

    async def run(self, stop: asyncio.Event) -> Ledger:
        """Run every worker until `stop` is set; the ledger."""
        await asyncio.gather(*(self._worker(number, stop) for number in range(self.workers)))
        return self.ledger


async def lost(ledger: Ledger, store: RedisTokenStore) -> list[str]:
    """Everything acknowledged that the cluster no longer holds, in words (empty: nothing)."""
    missing: list[str] = []
    for rollout_id, call_ids in ledger.puts.items():
        state = await store.admin.status(rollout_id)
        if state is None:
            missing.append(f"{rollout_id}: nothing stored")
            continue
        if rollout_id in ledger.retired:
            if not state.retired or (state.snapshot_id, state.version) != ledger.frozen[rollout_id]:
                missing.append(f"{rollout_id}: acknowledged retire, found {state}")
            continue
        absent = [call_id for call_id in call_ids if call_id not in state.entry_digests]
        if absent:
            missing.append(f"{rollout_id}: acknowledged puts {absent} are gone")
        acknowledged = ledger.frozen.get(rollout_id)
        if acknowledged and (
            not state.frozen or (state.snapshot_id, state.version) != acknowledged
        ):
            missing.append(f"{rollout_id}: acknowledged freeze, found {state}")
    return missing


async def reshard_during(
    cluster: RedisCluster,
    workload: Workload,
    *,
    slots: int,
    warm_up_s: float = 0.5,
    after_s: float = 0.5,
) -> Ledger:
    """The workload while `slots` slots move from the first primary to the second, then
    as many from the second to the third (with their keys)."""
    stop = asyncio.Event()
    traffic = asyncio.create_task(workload.run(stop))
    try:
        await asyncio.sleep(warm_up_s)
        first, second, third = cluster.primaries_now()
        await asyncio.to_thread(cluster.reshard, slots, first, second)
        second = next(node for node in cluster.primaries_now() if node.node_id == second.node_id)
        await asyncio.to_thread(cluster.reshard, slots, second, third)
        await asyncio.sleep(after_s)
    finally:
        stop.set()
    return await traffic


async def failover_during(
    cluster: RedisCluster, workload: Workload, *, warm_up_s: float = 1.0, after_s: float = 2.0
) -> Ledger:
    """The workload while a primary is SIGKILLed, its replica takes over, and the old
    primary is started again (it rejoins as a replica)."""
    stop = asyncio.Event()
    traffic = asyncio.create_task(workload.run(stop))
    try:
        await asyncio.sleep(warm_up_s)
        victim = cluster.primaries_now()[0]
        cluster.kill_primary(victim)
        await asyncio.to_thread(cluster.wait_failover, victim)
        await asyncio.to_thread(cluster.restart, victim)
        await asyncio.sleep(after_s)
    finally:
        stop.set()
    return await traffic
