"""bench.cluster_faults --proofs: WAIT on the script's connection, seeds, and per-primary health.

Each proof prints what it observed; `check` raises when an expectation fails,
so a run that prints "all proofs hold" has shown every one of them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis
from redis.crc import key_slot
from redis.exceptions import RedisClusterException

from bench._cluster_recipes import (
    ClusterCaller,
    cluster_client,
    ping_primaries,
    script_then_wait,
    script_then_wait_single,
)
from bench._cluster_traffic import PUT_SCRIPT, rollout_keys
from tests.support.redis_cluster import Node, RedisCluster
from tests.support.redis_replicated import ReplicatedRedis

__all__ = ["run_proofs"]

WAIT_TIMEOUT_MS = 500
PREFIX = "tf-proof:"


def check(condition: bool, what: str) -> None:
    print(f"  {'ok ' if condition else 'NO '} {what}")
    if not condition:
        raise AssertionError(what)


def keys_on(node: Node, label: str) -> list[str]:
    """The six keys of a rollout whose slot `node` serves."""
    number = 0
    while not node.owns(key_slot(f"{{ng:{label}{number}}}".encode())):
        number += 1
    return rollout_keys(PREFIX, f"{label}{number}")


async def timed(step: Callable[[], Awaitable[Any]]) -> tuple[Any, float]:
    started = time.monotonic()
    result = await step()
    return result, time.monotonic() - started


async def wait_elsewhere(port: int) -> str:
    """`WAIT 1 timeout` from a connection of its own (redis-cli), as a separate command would."""
    process = await asyncio.create_subprocess_exec(
        "redis-cli",
        "-p",
        str(port),
        "WAIT",
        "1",
        str(WAIT_TIMEOUT_MS),
        stdout=asyncio.subprocess.PIPE,
    )
    output, _ = await process.communicate()
    return output.decode().strip()


async def prove_wait_cluster() -> None:
    print("\nWAIT in a cluster (3 x 1): EVALSHA + WAIT in one pipeline to the slot's primary")
    with RedisCluster(primaries=3, replicas=1) as cluster:
        primary = cluster.primaries_now()[0]
        (replica,) = cluster.replicas_of(primary)
        keys = keys_on(primary, "wait")
        async with cluster_client(cluster.seed_urls) as client:
            script = client.register_script(PUT_SCRIPT)

            def put(call_id: str) -> Callable[[], Awaitable[tuple[Any, int]]]:
                return lambda: script_then_wait(
                    client,
                    script,
                    keys,
                    [call_id, "line", "digest"],
                    replicas=1,
                    timeout_ms=WAIT_TIMEOUT_MS,
                )

            # The first call meets NOSCRIPT (nothing loaded yet) and loads it there.
            (reply, acks), seconds = await timed(put("c1"))
            check(acks == 1, f"replica running: {acks} ack in {seconds * 1000:.0f} ms")
            cluster.pause(replica)
            try:
                (reply, acks), seconds = await timed(put("c2"))
                check(
                    acks == 0 and seconds >= WAIT_TIMEOUT_MS / 1000,
                    f"replica paused: {acks} acks after {seconds * 1000:.0f} ms "
                    f"(timeout {WAIT_TIMEOUT_MS} ms); the script's reply {reply!r}",
                )
                await script(keys=keys, args=["c3", "line", "digest"])
                lone, seconds = await timed(lambda: wait_elsewhere(primary.port))
                print(
                    f"  ..  the wrong way, WAIT 1 on another connection to the same primary "
                    f"(redis-cli), replica paused: {lone} in {seconds * 1000:.0f} ms "
                    "(that connection wrote nothing, so it has nothing to wait for: a false ack)"
                )
                summed, _ = await timed(lambda: client.execute_command("WAIT", 1, WAIT_TIMEOUT_MS))
                print(
                    f"  ..  the wrong way, WAIT without a target: redis-py sends it to every "
                    f"node and sums the answers: {summed}"
                )
            finally:
                cluster.resume(replica)
            (reply, acks), seconds = await timed(put("c4"))
            check(acks == 1, f"replica resumed: {acks} ack in {seconds * 1000:.0f} ms")


async def prove_wait_single() -> None:
    print("\nWAIT on one server (primary + 1 replica): pipeline(transaction=False)")
    with ReplicatedRedis(replica_count=1) as servers:
        (replica,) = servers.replicas
        client = Redis.from_url(servers.url)
        try:
            script = client.register_script(PUT_SCRIPT)
            keys = rollout_keys(PREFIX, "single")

            async def put(call_id: str) -> tuple[Any, int]:
                return await script_then_wait_single(
                    client,
                    script,
                    keys,
                    [call_id, "line", "digest"],
                    replicas=1,
                    timeout_ms=WAIT_TIMEOUT_MS,
                )

            (reply, acks), seconds = await timed(lambda: put("c1"))
            check(
                acks == 1,
                f"replica running (script not loaded before): {acks} ack, "
                f"{seconds * 1000:.0f} ms, reply {reply!r}",
            )
            servers.pause(replica)
            try:
                (reply, acks), seconds = await timed(lambda: put("c2"))
                check(
                    acks == 0 and seconds >= WAIT_TIMEOUT_MS / 1000,
                    f"replica paused: {acks} acks after {seconds * 1000:.0f} ms",
                )
            finally:
                servers.resume(replica)
            (reply, acks), seconds = await timed(lambda: put("c3"))
            check(acks == 1, f"replica resumed: {acks} ack in {seconds * 1000:.0f} ms")
        finally:
            await client.aclose()


async def prove_seeds() -> None:
    print("\nSeeds: several at start, and the seed's death once connected")
    with RedisCluster(primaries=3, replicas=1) as cluster:
        first = cluster.primaries_now()[0]
        others = [node.url for node in cluster.nodes() if node.node_id != first.node_id]
        # Connected through one seed, before that seed dies.
        caller = ClusterCaller([first.url], deadline_s=5.0)
        await caller.client.initialize()
        cluster.kill_primary(first)
        try:
            lonely = cluster_client([first.url])
            try:
                await lonely.initialize()
                check(False, "a client whose only seed is dead could start")
            except RedisClusterException as exc:
                check(True, f"only the dead seed: {type(exc).__name__}: {str(exc)[:70]}")
            finally:
                await lonely.aclose()
            several = cluster_client([first.url, *others])
            try:
                await several.initialize()
                check(len(several.get_primaries()) == 3, "dead seed first, others after: started")
            finally:
                await several.aclose()
            keys = keys_on(first, "seed")
            (reply, seconds) = await timed(
                lambda: caller.run("hset", lambda client: client.hset(keys[0], "k", "v"))
            )
            check(
                reply in (0, 1),
                f"the client connected through the dead seed wrote to the dead seed's slot "
                f"after {seconds * 1000:.0f} ms (the failover's time)",
            )
        finally:
            await caller.aclose()
            cluster.restart(first)


async def prove_health() -> None:
    print("\nHealth: PING every primary, name the one that is down")
    for replicas in (1, 0):
        with RedisCluster(primaries=3, replicas=replicas) as cluster:
            async with cluster_client(cluster.seed_urls) as client:
                answers = await ping_primaries(client, timeout_s=1.0)
                check(
                    all(error is None for error in answers.values()) and len(answers) == 3,
                    f"3 x {replicas}, all running: {len(answers)} primaries answer",
                )
                victim = cluster.primaries_now()[0]
                cluster.kill_primary(victim)
                answers, seconds = await timed(lambda: ping_primaries(client, timeout_s=1.0))
                down = [name for name, error in answers.items() if error]
                check(
                    down == [victim.address],
                    f"3 x {replicas}, one killed: down {down} in {seconds * 1000:.0f} ms "
                    f"({answers[victim.address]})",
                )
                if replicas:
                    await asyncio.to_thread(cluster.wait_failover, victim)
                    answers = await ping_primaries(client, timeout_s=1.0)
                    check(
                        all(error is None for error in answers.values()) and len(answers) == 3,
                        f"after the failover, the next round: {sorted(answers)} answer "
                        f"(the killed node is no primary any more)",
                    )
                cluster.restart(victim)


async def run_proofs() -> None:
    for proof in (prove_wait_cluster, prove_wait_single, prove_seeds, prove_health):
        await proof()
    print("\nall proofs hold")
