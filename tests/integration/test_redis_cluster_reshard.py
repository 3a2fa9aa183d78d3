"""Slot moves are invisible: thousands of slots move while 16 writers and finalizers run.

Real processes on loopback: a 3-primary cluster (one replica each), `store
serve --redis-cluster --min-replicas-acked 1` and a finalizer whose two
sources reach the same keys through the store server and directly. While
`redis-cli --cluster reshard` moves 1000 slots and then 1000 more (with their
keys: a population of rollouts was written first), 16 workers write small
rollouts through the store server, finalize each one (alternating the two
sources) and retire every other one, taking every answer as final: no retry
of theirs hides a failure. Then the cluster is read back.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.captures import make_entry
from tests.support.cluster_workload import Ledger, Workload, lost, reshard_during, serving
from tests.support.redis_cluster import RedisCluster, needs_redis_server
from token_finalizer.sources.redis import RedisTokenStore

pytestmark = needs_redis_server

WORKERS = 16
POPULATION = 1000
SLOTS_PER_MOVE = 1000
WARM_UP_S = 0.5
AFTER_S = 0.5


async def _populate(store: RedisTokenStore, count: int) -> None:
    """Rollouts in every slot range, so that a reshard has keys to move."""
    semaphore = asyncio.Semaphore(64)

    async def one(number: int) -> None:
        async with semaphore:
            await store.put(make_entry(f"fill-{number}", "c1", [1, 2], [3]))

    await asyncio.gather(*(one(number) for number in range(count)))


@pytest.fixture(scope="module")
def ledger(cluster: RedisCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ledger]:
    """The workload's ledger, from traffic that ran through two reshards; and what was lost."""
    prefix = f"tf-reshard:{uuid.uuid4().hex[:8]}:"
    directory: Path = tmp_path_factory.mktemp("reshard")
    with serving(cluster, directory, prefix=prefix, min_replicas_acked=1) as topology:

        async def scenario() -> Ledger:
            store = topology.open_store()
            try:
                await _populate(store, POPULATION)
                workload = Workload(topology, workers=WORKERS)
                result = await reshard_during(
                    cluster, workload, slots=SLOTS_PER_MOVE, warm_up_s=WARM_UP_S, after_s=AFTER_S
                )
                result.problems.extend(await lost(result, store))
                return result
            finally:
                await store.close()

        yield asyncio.run(scenario())


def test_no_answer_is_a_server_error(ledger: Ledger) -> None:
    """Not one 5xx while slots move: every put, finalize and retire answered."""
    assert ledger.server_errors == 0, dict(ledger.statuses)


def test_no_record_is_masked_and_nothing_is_lost(ledger: Ledger) -> None:
    """Every finalize built all 3 calls unmasked; every acknowledged write is in the cluster."""
    assert ledger.problems == []


def test_the_traffic_ran_throughout(ledger: Ledger) -> None:
    """Hundreds of rollouts were written, frozen and retired while the slots moved."""
    assert len(ledger.frozen) >= 100 and len(ledger.retired) >= 50, dict(ledger.statuses)
