"""Redis Cluster: finalize throughput against one Redis, and latency while slots move.

    .venv/bin/python -m bench.cluster [--clients 32] [--rollouts 1000] [--workers 16]
        [--phase-s 8] [--slots 1500] [--skip-throughput] [--skip-reshard] [--faults]

Part (a), throughput: small rollouts (5 calls, 2k tokens of context, written
first) finalized through 1 and through 2 `token-finalizer serve` processes
(1 worker each: 2 replicas) whose one source is a `redis` source on one
private Redis, on a 3-primary cluster, and on a 3 x 1 cluster with
`min_replicas_acked: 1` (every freeze waits for its replica). Raw HTTP/1.1
keep-alive clients (bench/scaleout.py's load generator); a fixed number of
fresh rollouts per configuration after a warm-up. Figures: finalize/s, p50,
p99, and the 2 / 1 process ratios.

Part (b), latency during a reshard: on a 3 x 1 cluster, `store serve
--redis-cluster` and a finalizer with both kinds of source
(tests/support/cluster_workload.py), `--workers` coroutines write small
rollouts through the store server (3 puts), finalize them (alternating the
source) and retire every other one: first `--phase-s` of steady state, then
while 2 x `--slots` slots move. Per operation: count, p50, p99, max, and
any non-200 answer.

`--faults` also runs the scenarios of the fault tests (reshard under 16
workers; a failover with `min_replicas_acked 1`, callers retrying as the
client package does) and prints what they did and what was lost.

Every Redis is started here (tests/support/redis_cluster.py,
tests/support/redis_replicated.py) and removed at the end. On this 2-core
machine the load generator, Redis and the servers share the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import stamina

from bench.scaleout import WARMUP_ROLLOUTS, finalizers, load, put_small_rollouts
from bench.service import SMALL_CALLS, SMALL_TOKENS_PER_TURN
from tests.support.cluster_workload import (
    Ledger,
    Workload,
    failover_during,
    lost,
    reshard_during,
    serving,
)
from tests.support.redis_cluster import RedisCluster
from tests.support.redis_replicated import ReplicatedRedis
from token_finalizer.sources.redis import RedisTokenStore
from token_finalizer_client.transport import RetryPolicy

SETUPS = ("redis", "cluster", "cluster+wait")


# -- part (a): throughput ----------------------------------------------------------------------


@contextmanager
def _redis(setup: str) -> Iterator[tuple[list[str], bool, int]]:
    """(urls, cluster, min_replicas_acked) of a fresh Redis for `setup`."""
    if setup == "redis":
        with ReplicatedRedis(replica_count=0) as single:
            yield [single.url], False, 0
        return
    replicas = 1 if setup == "cluster+wait" else 0
    with RedisCluster(primaries=3, replicas=replicas) as cluster:
        yield cluster.seed_urls, True, replicas


def _source(urls: Sequence[str], cluster: bool, replicas: int, prefix: str) -> str:
    listed = ", ".join(f"'{url}'" for url in urls)
    return (
        "sources:\n  local:\n    kind: redis\n"
        f"    urls: [{listed}]\n    cluster: {str(cluster).lower()}\n"
        f"    min_replicas_acked: {replicas}\n    key_prefix: '{prefix}'\n"
    )


async def _write_small(
    urls: Sequence[str], cluster: bool, replicas: int, prefix: str, count: int
) -> list[str]:
    store = RedisTokenStore(
        urls=list(urls),
        cluster=cluster,
        key_prefix=prefix,
        min_replicas_acked=replicas,
        timeout_s=30,
    )
    return await put_small_rollouts(store, count)


def throughput(work: Path, clients: int, rollouts: int) -> None:
    results: dict[tuple[str, int], dict[str, Any]] = {}
    for setup in SETUPS:
        with _redis(setup) as (urls, cluster, replicas):
            for processes in (1, 2):
                prefix = f"bench-cluster:{uuid.uuid4().hex[:8]}:"
                count = WARMUP_ROLLOUTS + rollouts
                rollout_ids = asyncio.run(_write_small(urls, cluster, replicas, prefix, count))
                config = _source(urls, cluster, replicas, prefix)
                with finalizers(config, work, processes) as ports:
                    results[setup, processes] = asyncio.run(load(ports, rollout_ids, clients))
    print(
        f"\n(a) small rollouts ({SMALL_CALLS} calls, {SMALL_CALLS * SMALL_TOKENS_PER_TURN} "
        f"tokens of context): {rollouts} fresh rollouts after {WARMUP_ROLLOUTS} of warm-up, "
        f"{clients} keep-alive clients, {os.cpu_count()} cores"
    )
    print(
        f"{'redis':>13} {'processes':>10} {'finalize/s':>11} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'requests':>9} {'non-200':>8}"
    )
    for (setup, processes), r in results.items():
        print(
            f"{setup:>13} {processes:>10} {r['rate']:>11.0f} {r['p50_ms']:>8.1f} "
            f"{r['p99_ms']:>8.1f} {r['requests']:>9} {r['failures']:>8}"
        )
    for setup in SETUPS:
        ratio = results[setup, 2]["rate"] / results[setup, 1]["rate"]
        print(f"{setup}: 2 processes / 1 process: {ratio:.2f}x")
    for processes in (1, 2):
        ratio = results["cluster", processes]["rate"] / results["redis", processes]["rate"]
        print(f"{processes} process(es): cluster / one redis: {ratio:.2f}x")


# -- part (b): latency while slots move ------------------------------------------------------


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def _print_latencies(name: str, ledger: Ledger, seconds: float) -> None:
    others = {status: n for status, n in ledger.statuses.items() if status != 200}
    print(
        f"  {name}: {seconds:.1f} s, {len(ledger.frozen)} rollouts finalized "
        f"({len(ledger.frozen) / seconds:.0f}/s), non-200 answers: {others or 'none'}"
    )
    for operation, values in sorted(ledger.latencies.items()):
        p50, p99 = 1000 * statistics.median(values), 1000 * _percentile(values, 0.99)
        print(
            f"    {operation:>8}: {len(values):>6} calls  p50 {p50:7.1f} ms  "
            f"p99 {p99:7.1f} ms  max {1000 * max(values):7.1f} ms"
        )


async def _steady(workload: Workload, seconds: float) -> Ledger:
    stop = asyncio.Event()
    traffic = asyncio.create_task(workload.run(stop))
    await asyncio.sleep(seconds)
    stop.set()
    return await traffic


def reshard_latency(work: Path, workers: int, phase_s: float, slots: int) -> None:
    print(
        f"\n(b) per-operation latency, {workers} workers through `store serve` and a finalizer "
        f"on a 3 x 1 cluster: steady state, then while 2 x {slots} slots move"
    )
    with RedisCluster(primaries=3, replicas=1) as cluster:
        prefix = f"bench-reshard:{uuid.uuid4().hex[:8]}:"
        with serving(cluster, work, prefix=prefix) as topology:
            started = time.monotonic()
            steady = asyncio.run(_steady(Workload(topology, workers=workers), phase_s))
            _print_latencies("steady", steady, time.monotonic() - started)
            started = time.monotonic()
            moving = asyncio.run(
                reshard_during(cluster, Workload(topology, workers=workers), slots=slots)
            )
            _print_latencies("reshard", moving, time.monotonic() - started)


# -- --faults: the fault tests' scenarios, with their figures ---------------------------------


async def _with_losses(ledger: Ledger, store: RedisTokenStore) -> Ledger:
    try:
        ledger.problems.extend(await lost(ledger, store))
    finally:
        await store.close()
    return ledger


def _print_fault(name: str, ledger: Ledger, seconds: float) -> None:
    operations = sum(ledger.statuses.values())
    print(
        f"  {name}: {seconds:.1f} s, {operations} answers {dict(ledger.statuses)}, "
        f"Retry-After of 5xx {dict(ledger.retry_after) or '-'}; acknowledged: "
        f"{sum(map(len, ledger.puts.values()))} puts, {len(ledger.frozen)} freezes, "
        f"{len(ledger.retired)} retires; lost or wrong: {len(ledger.problems)}"
    )
    for problem in ledger.problems[:10]:
        print(f"    {problem}")


def faults(work: Path, workers: int, slots: int) -> None:
    print("\n(c) the fault tests' scenarios")
    with RedisCluster(primaries=3, replicas=1) as cluster:
        prefix = f"bench-faults:{uuid.uuid4().hex[:8]}:"
        with serving(cluster, work, prefix=prefix, min_replicas_acked=1) as topology:
            started = time.monotonic()
            ledger = asyncio.run(
                reshard_during(cluster, Workload(topology, workers=workers), slots=slots)
            )
            ledger = asyncio.run(_with_losses(ledger, topology.open_store()))
            _print_fault(
                f"reshard of 2 x {slots} slots, {workers} workers, no retries",
                ledger,
                time.monotonic() - started,
            )
    with RedisCluster(primaries=3, replicas=1) as cluster:
        prefix = f"bench-faults:{uuid.uuid4().hex[:8]}:"
        with serving(
            cluster, work, prefix=prefix, min_replicas_acked=1, redis_timeout_s=1.5
        ) as topology:
            started = time.monotonic()
            policy = RetryPolicy(max_retries=30)
            ledger = asyncio.run(
                failover_during(cluster, Workload(topology, workers=8, retry_policy=policy))
            )
            ledger = asyncio.run(_with_losses(ledger, topology.open_store()))
            _print_fault(
                "failover, min_replicas_acked 1, 8 workers retrying",
                ledger,
                time.monotonic() - started,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32, help="keep-alive connections (a)")
    parser.add_argument(
        "--rollouts", type=int, default=1000, help="measured rollouts per configuration (a)"
    )
    parser.add_argument("--workers", type=int, default=16, help="writers and finalizers (b)")
    parser.add_argument("--phase-s", type=float, default=8.0, help="steady-state seconds (b)")
    parser.add_argument("--slots", type=int, default=1500, help="slots per move (b, faults)")
    parser.add_argument("--skip-throughput", action="store_true", help="leave out (a)")
    parser.add_argument("--skip-reshard", action="store_true", help="leave out (b)")
    parser.add_argument("--faults", action="store_true", help="also run the fault scenarios")
    args = parser.parse_args()
    # The failover's callers retry with real waits; their retries are counted, not logged.
    stamina.instrumentation.set_on_retry_hooks([])
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as work, stamina.set_testing(False):
        if not args.skip_throughput:
            throughput(Path(work), args.clients, args.rollouts)
        if not args.skip_reshard:
            reshard_latency(Path(work), args.workers, args.phase_s, args.slots)
        if args.faults:
            faults(Path(work), args.workers, args.slots)


if __name__ == "__main__":
    main()
