"""Writers and finalizers in separate processes racing on one rollout (file and redis stores).

One pool of spawned processes serves the module (started and imported once);
every job waits for a common start instant, so the processes really race.
"""

from __future__ import annotations

import multiprocessing
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.support import store_workers
from tests.support.redis import unique_prefix
from tests.support.store_workers import Where, writer_entry
from token_finalizer import FileTokenStore
from token_finalizer.sources.redis import RedisTokenStore

pytestmark = pytest.mark.anyio

WORKERS = 4
# Room for the pool to hand every job to a worker before they all start.
START_DELAY_S = 0.3
RESULT_TIMEOUT_S = 20


@pytest.fixture(scope="module")
def pool() -> Iterator[ProcessPoolExecutor]:
    """Four spawned worker processes, started and warmed up once for the module."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=WORKERS, mp_context=context) as executor:
        warm = [executor.submit(store_workers.warm_up, 0.3) for _ in range(WORKERS)]
        assert all(future.result(timeout=60) for future in warm)
        yield executor


@pytest.fixture(params=["file", "redis"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Where]:
    """The shared store every process opens: a directory, or a redis key prefix."""
    if request.param == "file":
        yield ("file", str(tmp_path), "")
        return
    url = request.getfixturevalue("redis_url")
    with unique_prefix(url, "race") as prefix:
        yield ("redis", url, prefix)


def _local(where: Where) -> Any:
    kind, location, prefix = where
    return (
        FileTokenStore(location) if kind == "file" else RedisTokenStore(location, key_prefix=prefix)
    )


def _race(pool: ProcessPoolExecutor, jobs: list[tuple[Any, ...]]) -> list[Any]:
    """Run every (function, *args) job in the pool from one common start instant."""
    start_at = time.time() + START_DELAY_S
    futures: list[Future[Any]] = [pool.submit(job[0], job[1], start_at, *job[2:]) for job in jobs]
    return [future.result(timeout=RESULT_TIMEOUT_S) for future in futures]


async def test_writers_in_processes_lose_no_call(pool: ProcessPoolExecutor, where: Where) -> None:
    """Four processes announcing and putting into one rollout: every call stored once, whole."""
    results = _race(
        pool, [(store_workers.announce_and_put, where, "shared", w, 25) for w in range(WORKERS)]
    )
    store = _local(where)
    snapshot = await store.freeze("shared")
    await store.close()
    by_id = {entry.model_call_id: entry for entry in snapshot.entries}
    expected = {call for result in results for call in result["stored"]} | {"shared"}
    assert set(by_id) == expected and len(snapshot.entries) == 4 * 25 + 1
    for writer in range(WORKERS):
        entry = by_id[f"w{writer}-c24"]
        assert (
            entry.prompt_token_ids.tolist()
            == writer_entry("shared", writer, 24)["prompt_token_ids"]
        )
    assert snapshot.incomplete is False and snapshot.version == 4 * 25 + 1 + 1


async def test_conflicting_writers_store_exactly_one_payload(
    pool: ProcessPoolExecutor, where: Where
) -> None:
    """Four processes put different payloads under one call id: one wins, three conflict."""
    outcomes = _race(
        pool, [(store_workers.conflicting_put, where, "contested", w) for w in range(WORKERS)]
    )
    assert Counter(outcomes) == {"stored": 1, "conflict": 3}
    store = _local(where)
    snapshot = await store.freeze("contested")
    await store.close()
    (entry,) = snapshot.entries
    assert entry.generation_token_ids.tolist() == [outcomes.index("stored") + 10]
    assert snapshot.incomplete is True


async def test_puts_racing_a_freeze_are_stored_or_refused(
    pool: ProcessPoolExecutor, where: Where
) -> None:
    """Each put racing the freeze is in the snapshot, whole, or was refused as frozen."""
    count = 250
    writers = [(store_workers.put_until_frozen, where, "race", w, count) for w in range(3)]
    *written, frozen = _race(pool, [*writers, (store_workers.freeze, where, "race", 40)])
    acked = {call for result in written for call in result["acked"]}
    refused = {call for result in written for call in result["refused"]}
    assert len(acked) + len(refused) == 3 * count and not acked & refused
    assert acked and refused, "the freeze did not land among the puts"
    assert set(frozen["entries"]) == acked
    for call_id, (prompt, generation) in frozen["entries"].items():
        writer, index = (int(part[1:]) for part in call_id.split("-"))
        expected = writer_entry("race", writer, index)
        assert (prompt, generation) == (
            expected["prompt_token_ids"],
            expected["generation_token_ids"],
        )
    assert frozen["version"] == len(acked) + 1


async def test_racing_freezes_agree_on_one_snapshot(
    pool: ProcessPoolExecutor, where: Where
) -> None:
    """Four processes freezing at once all get the same snapshot id, version and entries."""
    store = _local(where)
    for index in range(5):
        await store.put(writer_entry("twice", 0, index))
    await store.close()
    snapshots = _race(pool, [(store_workers.freeze, where, "twice") for _ in range(WORKERS)])
    identities = {(s["snapshot_id"], s["version"], tuple(sorted(s["entries"]))) for s in snapshots}
    assert len(identities) == 1
    assert next(iter(identities))[1] == 6


async def test_racing_retires_end_in_exactly_one_consistent_outcome(
    pool: ProcessPoolExecutor, where: Where
) -> None:
    """Two matching drops, a stale drop and a late mark: either the drops win or the mark does."""
    store = _local(where)
    seen = set()
    for round_ in range(4):
        rollout_id = f"retire-{round_}"
        await store.put(writer_entry(rollout_id, 0, 0))
        snapshot = await store.freeze(rollout_id)
        ref = (snapshot.snapshot_id, snapshot.version)
        dropped_a, dropped_b, stale, mark = _race(
            pool,
            [
                (store_workers.drop, where, rollout_id, *ref),
                (store_workers.drop, where, rollout_id, *ref),
                (store_workers.drop, where, rollout_id, ref[0], ref[1] - 1),
                (store_workers.mark_incomplete, where, rollout_id, "late"),
            ],
        )
        state = await store.admin.status(rollout_id)
        assert state is not None
        assert stale is False
        if mark == "retired":
            assert (dropped_a, dropped_b, state.retired) == (True, True, True)
            assert state.version == snapshot.version
        else:
            assert (dropped_a, dropped_b, state.retired) == (False, False, False)
            assert (state.incomplete, state.version) == (True, snapshot.version + 1)
        seen.add(mark)
    await store.close()
    assert seen <= {"retired", "marked"}
