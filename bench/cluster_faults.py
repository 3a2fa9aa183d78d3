"""Redis Cluster under faults: what redis-py's asyncio cluster client raises, and for how long.

    .venv/bin/python -m bench.cluster_faults [--scenario all] [--mode all] [--tasks 16]
        [--population 3000] [--wait N] [--after 1.5]
    .venv/bin/python -m bench.cluster_faults --proofs

Each scenario starts its own cluster (tests/support/redis_cluster.py), fills
it with `--population` rollouts, drives the capture store's kind of traffic
(bench/_cluster_traffic.py) from `--tasks` coroutines sharing one
`redis.asyncio.RedisCluster`, injects one fault, and reports every exception
that escaped (per operation), when the first and last came relative to the
fault, the longest time without one successful call, and what the robust
caller retried and absorbed.

Scenarios: `reshard` (3 x 1: 3000 slots move, then 3000 more, while traffic
runs), `failover` (3 x 1: a primary is SIGKILLed, its replica takes over, the
old one comes back), `no-replica` (3 x 0, appendonly: a primary is killed,
stays down 3 s, and is restarted), `seed` (3 x 1: the client's only seed, a
primary, is killed).

Modes: `raw` (the client as the redis store builds it today, every exception
escapes), `tuned` (bench/_cluster_recipes.py's `cluster_client`: several
seeds, `reinitialize_steps=0`, topology read before each call, no retry of
ours) and `robust` (`ClusterCaller`: the tuned client, redis-py's own retries
off, every transient error retried within a 5 s deadline). `--wait N` follows
every put by WAIT N on the script's connection (`script_then_wait`).

`--proofs` (bench/_cluster_proofs.py) shows WAIT counting 1 replica, then 0
with the replica paused (cluster and single server), a client starting from
several seeds and outliving its seed, and PING of every primary naming the
one that is down.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import RedisCluster as AsyncRedisCluster

from bench._cluster_proofs import run_proofs
from bench._cluster_recipes import ClusterCaller, cluster_client
from bench._cluster_traffic import (
    PUT_SCRIPT,
    READ_SCRIPT,
    Call,
    Outcomes,
    rollout_keys,
    run_traffic,
)
from tests.support.redis_cluster import Node, RedisCluster

POPULATION = 3000
WARM_UP_S = 1.0
AFTER_S = 1.5
DEADLINE_S = 5.0
STORE_TIMEOUT_S = 10.0  # the redis store's default timeout_s


@dataclass
class Timeline:
    """When the fault began and the marks that followed (monotonic seconds)."""

    fault: float = 0.0
    marks: list[tuple[str, float]] = field(default_factory=list)

    def mark(self, what: str) -> None:
        self.marks.append((what, time.monotonic()))


Fault = Callable[[RedisCluster, Timeline], Awaitable[None]]


async def _reshard(cluster: RedisCluster, timeline: Timeline) -> None:
    first, second, third = cluster.primaries_now()
    timeline.fault = time.monotonic()
    await asyncio.to_thread(cluster.reshard, 3000, first, second)
    timeline.mark("first reshard done")
    second = next(node for node in cluster.primaries_now() if node.node_id == second.node_id)
    await asyncio.to_thread(cluster.reshard, 3000, second, third)
    timeline.mark("second reshard done")


def _kill_a_primary(cluster: RedisCluster, timeline: Timeline) -> Node:
    """SIGKILL the first primary (the fault's moment); the node killed."""
    victim = cluster.primaries_now()[0]
    timeline.fault = time.monotonic()
    cluster.kill_primary(victim)
    return victim


async def _failover(cluster: RedisCluster, timeline: Timeline) -> None:
    victim = _kill_a_primary(cluster, timeline)
    await asyncio.to_thread(cluster.wait_failover, victim)
    timeline.mark("failover seen by every node")
    await asyncio.sleep(1.0)
    await asyncio.to_thread(cluster.restart, victim)
    timeline.mark("old primary back as replica")


async def _no_replica(cluster: RedisCluster, timeline: Timeline) -> None:
    victim = _kill_a_primary(cluster, timeline)
    await asyncio.sleep(3.0)
    timeline.mark("restart begins")
    await asyncio.to_thread(cluster.restart, victim)
    timeline.mark("cluster ok again")


async def _seed(cluster: RedisCluster, timeline: Timeline) -> None:
    # The client was seeded with this node only (see `_client_for`).
    victim = _kill_a_primary(cluster, timeline)
    await asyncio.to_thread(cluster.wait_failover, victim)
    timeline.mark("failover seen by every node")


@dataclass(frozen=True)
class Scenario:
    name: str
    primaries: int
    replicas: int
    fault: Fault
    appendonly: bool = False


MODES = ("raw", "tuned", "robust")
SCENARIOS = {
    "reshard": Scenario("reshard", 3, 1, _reshard),
    "failover": Scenario("failover", 3, 1, _failover),
    "no-replica": Scenario("no-replica", 3, 0, _no_replica, appendonly=True),
    "seed": Scenario("seed", 3, 1, _seed),
}


@dataclass(frozen=True)
class Settings:
    """How one scenario is run (the command line's options)."""

    mode: str
    tasks: int = 16
    after_s: float = AFTER_S
    wait_replicas: int = 0
    population: int = POPULATION


async def _fill(
    client: AsyncRedisCluster, scripts: dict[str, Any], prefix: str, population: int
) -> None:
    """One put per rollout of the population, so every slot has keys to migrate."""
    semaphore = asyncio.Semaphore(64)

    async def put(number: int) -> None:
        async with semaphore:
            keys = rollout_keys(prefix, f"r{number}")
            await scripts["put"](keys=keys, args=["c0", "x" * 64, "d"], client=client)

    await asyncio.gather(*(put(number) for number in range(population)))


class RawCalls:
    """The client as the redis store creates it today; whatever redis-py raises escapes."""

    def __init__(self, seeds: list[str], *, tuned: bool) -> None:
        self.tuned = tuned
        if tuned:
            self.client = cluster_client(seeds)
        else:
            self.client = AsyncRedisCluster.from_url(
                seeds[0], socket_timeout=STORE_TIMEOUT_S, socket_connect_timeout=5.0
            )
        self.rebuilt = 0
        self.absorbed: Counter[str] = Counter()

    async def run(self, what: str, call: Callable[[Any], Awaitable[Any]]) -> Any:
        if self.tuned:
            await self.client.initialize()
        return await call(self.client)

    async def aclose(self) -> None:
        await self.client.aclose()


def _calls(mode: str, seeds: list[str]) -> RawCalls | ClusterCaller:
    if mode == "robust":
        return ClusterCaller(seeds, deadline_s=DEADLINE_S)
    return RawCalls(seeds, tuned=mode == "tuned")


async def run_scenario(scenario: Scenario, settings: Settings) -> dict[str, Any]:
    """One scenario in one mode on a fresh cluster; its figures."""
    with RedisCluster(
        primaries=scenario.primaries, replicas=scenario.replicas, appendonly=scenario.appendonly
    ) as cluster:
        if scenario.name == "seed":
            seeds = [cluster.primaries_now()[0].url]
        else:
            seeds = [node.url for node in cluster.nodes()]
        prefix = f"tf-faults:{uuid.uuid4().hex[:8]}:"
        calls = _calls(settings.mode, seeds)
        scripts = {
            "put": calls.client.register_script(PUT_SCRIPT),
            "read": calls.client.register_script(READ_SCRIPT),
        }
        # Filled through a client of its own, read first, so that the run
        # starts from a loaded cluster whatever the mode does at start-up.
        async with cluster_client(seeds) as filler:
            await _fill(filler, scripts, prefix, settings.population)
        stop = asyncio.Event()
        timeline = Timeline()
        traffic = asyncio.create_task(
            run_traffic(
                calls.run,
                scripts,
                prefix=prefix,
                tasks=settings.tasks,
                population=settings.population,
                stop=stop,
                wait_replicas=settings.wait_replicas,
            )
        )
        await asyncio.sleep(WARM_UP_S)
        await scenario.fault(cluster, timeline)
        await asyncio.sleep(settings.after_s)
        stop.set()
        outcomes = await traffic
        await calls.aclose()
    figures = _figures(scenario.name, settings.mode, outcomes, timeline, calls.rebuilt)
    figures["absorbed"] = calls.absorbed.most_common()
    return figures


def _figures(
    name: str, mode: str, outcomes: Outcomes, timeline: Timeline, rebuilt: int
) -> dict[str, Any]:
    failed = outcomes.failed()
    ok = [call for call in outcomes.calls if not call.error and call.ended >= timeline.fault]
    seconds = sorted(call.seconds for call in ok)
    return {
        "scenario": name,
        "mode": mode,
        "calls": len(outcomes.calls),
        "failed": len(failed),
        "errors": outcomes.errors().most_common(),
        "phases": _phases(failed, timeline),
        "first_error_s": failed[0].ended - timeline.fault if failed else None,
        "last_error_s": failed[-1].ended - timeline.fault if failed else None,
        "longest_gap_s": outcomes.longest_gap(timeline.fault),
        "p50_ms": 1000 * statistics.median(seconds) if seconds else None,
        "max_ms": 1000 * seconds[-1] if seconds else None,
        "marks": [(what, at - timeline.fault) for what, at in timeline.marks],
        "client_rebuilt": rebuilt,
    }


def _phases(failed: list[Call], timeline: Timeline) -> dict[str, int]:
    """Failures before the fault, during it (until its last mark), and after."""
    end = timeline.marks[-1][1] if timeline.marks else timeline.fault
    return {
        "before": sum(call.ended < timeline.fault for call in failed),
        "during": sum(timeline.fault <= call.ended <= end for call in failed),
        "after": sum(call.ended > end for call in failed),
    }


def _print(figures: dict[str, Any]) -> None:
    print(f"\n== {figures['scenario']} / {figures['mode']}")
    print(
        f"calls {figures['calls']}, failed {figures['failed']}, "
        f"client rebuilt {figures['client_rebuilt']}x"
    )
    for what, at in figures["marks"]:
        print(f"  +{at:6.2f} s  {what}")
    if figures["failed"]:
        phases = figures["phases"]
        print(
            f"  errors from +{figures['first_error_s']:.2f} s to +{figures['last_error_s']:.2f} s "
            f"(before the fault {phases['before']}, during {phases['during']}, "
            f"after {phases['after']})"
        )
    print(
        f"  longest time without a success: {figures['longest_gap_s']:.2f} s; "
        f"successful calls after the fault: p50 {figures['p50_ms']:.1f} ms, "
        f"max {figures['max_ms']:.0f} ms"
    )
    for error, count in figures["errors"]:
        print(f"  {count:6d}  {error}")
    if figures["absorbed"]:
        absorbed = ", ".join(f"{name} {count}" for name, count in figures["absorbed"])
        print(f"  retried and absorbed: {absorbed}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="all", choices=["all", *SCENARIOS])
    parser.add_argument("--mode", default="all", choices=["all", *MODES])
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--population", type=int, default=POPULATION, help="rollouts stored")
    parser.add_argument(
        "--wait", type=int, default=0, help="follow every put by WAIT for this many replicas"
    )
    parser.add_argument(
        "--after", type=float, default=AFTER_S, help="seconds of traffic after the fault ends"
    )
    parser.add_argument(
        "--proofs", action="store_true", help="run the WAIT, seed and health proofs instead"
    )
    options = parser.parse_args()
    if options.proofs:
        asyncio.run(run_proofs())
        return
    names = list(SCENARIOS) if options.scenario == "all" else [options.scenario]
    modes = list(MODES) if options.mode == "all" else [options.mode]
    for name in names:
        for mode in modes:
            settings = Settings(
                mode, options.tasks, options.after, options.wait, options.population
            )
            _print(asyncio.run(run_scenario(SCENARIOS[name], settings)))


if __name__ == "__main__":
    main()
