"""The staging clients against the real store server on loopback: memory, directory and Redis.

HttpCaptureLedger, HttpStagingSink and HttpStagingSource talk to
`token_finalizer.store_server` (uvicorn on 127.0.0.1) with role tokens:
the ledger and the sink hold the writer token, the source and the manifest
reader the finalizer token (docs/staging.md#the-client). The rows and
records are NeMo Gym 0.7.0's own (tests/vectors/nemo_gym_0_7_staging).

These tests need the store server's staging routes (the ledger, stage,
fetch, extras and attachments routes of the store protocol); the unit
tests of the same clients run against an in-process stand-in of those
routes (`staging_stand_in`). The end-to-end tests of the whole flow (finalize
and retire through the finalizer) are the finalizer's.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from tests.client.staged_calls import staged_chain, vector_attachments, vector_records
from tests.support.staging_vectors import case_by_name
from tests.support.store_servers import STORE_KINDS, served_store
from token_finalizer.core.staging import StagedCallRecord
from token_finalizer.store_server.roles import StoreTokens
from token_finalizer_client import (
    HttpCaptureLedger,
    HttpStagingSink,
    HttpStagingSource,
    LedgerConflictError,
    PermissionDeniedError,
)

pytestmark = pytest.mark.anyio

WRITER, FINALIZER = "writer-token", "finalizer-token"
CLEAN = vector_records("clean_chain")
RECORD_CHAIN = case_by_name("ledger.json", "record_chain")
COMMITS = [op["commit"] for op in RECORD_CHAIN["inputs"]["ops"] if op["op"] == "record"]
GYM_MANIFEST = RECORD_CHAIN["expected"]["file"]["results"][3]["result"]


@pytest.fixture(scope="module", params=STORE_KINDS)
def store_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A store server with writer and finalizer tokens over a memory, file, then redis store."""
    tokens = StoreTokens(writer=(WRITER,), finalizer=(FINALIZER,))
    directory = tmp_path_factory.mktemp("staging-e2e")
    with served_store(request.param, directory, "staging-e2e", tokens=tokens) as url:
        yield url


@pytest.fixture
async def ledger(store_url: str) -> AsyncIterator[HttpCaptureLedger]:
    """A model server's ledger (writer token), closed after the test."""
    opened = HttpCaptureLedger(store_url, token=WRITER)
    yield opened
    await opened.close()


@pytest.fixture
def sink(store_url: str) -> Iterator[HttpStagingSink]:
    """An inference worker's sink (writer token)."""
    with HttpStagingSink(store_url, token=WRITER) as opened:
        yield opened


@pytest.fixture
def source(store_url: str) -> Iterator[HttpStagingSource]:
    """A trainer's source (finalizer token)."""
    with HttpStagingSource(store_url, token=FINALIZER) as opened:
        yield opened


def _commits(rollout_id: str) -> list[dict[str, Any]]:
    """The record_chain commits of ledger.json, moved to `rollout_id` (a rollout of this test)."""
    moved = []
    for commit in copy.deepcopy(COMMITS):
        commit["rollout_id"] = rollout_id
        commit["record"]["staging_key"] = f"{rollout_id}/{commit['record']['model_call_id']}"
        commit["staging_chain"] = [
            f"{rollout_id}/{key.split('/')[1]}" for key in commit["staging_chain"]
        ]
        moved.append(commit)
    return moved


def _fresh_id() -> str:
    return f"r-{uuid.uuid4().hex[:12]}"


def _freeze(store_url: str, rollout_id: str) -> None:
    """Freeze the rollout through the store server, as the finalizer does."""
    path = f"/ng-rollout/{rollout_id}/training-token-capture/freeze"
    headers = {"Authorization": f"Bearer {FINALIZER}"}
    httpx.post(store_url + path, headers=headers, timeout=10).raise_for_status()


# -- the ledger -----------------------------------------------------------------------------------


async def test_recorded_rows_make_gyms_manifest(ledger: HttpCaptureLedger, store_url: str) -> None:
    """Three commits give the manifest Gym's file ledger gave, read with the finalizer token."""
    rollout_id = _fresh_id()
    for commit in _commits(rollout_id):
        await ledger.record(commit)
    reader = HttpCaptureLedger(store_url, token=FINALIZER)
    manifest = await reader.manifest(rollout_id)
    await reader.close()
    expected = copy.deepcopy(GYM_MANIFEST)
    expected["rollout_id"] = rollout_id
    for record in expected["records"]:
        record["staging_key"] = f"{rollout_id}/{record['model_call_id']}"
    assert manifest == expected


async def test_a_recorded_call_is_a_parent_at_once(ledger: HttpCaptureLedger) -> None:
    """After c1's record returns, c2's request resolves to c1 with its chain (any worker)."""
    rollout_id = _fresh_id()
    c1, c2, _ = _commits(rollout_id)
    await ledger.record(c1)
    resolution = await ledger.resolve(rollout_id, c2["request_items"])
    assert resolution.match is not None
    assert (resolution.match.model_call_id, resolution.match.staging_chain) == (
        "c1",
        (f"{rollout_id}/c1",),
    )
    assert resolution.match.prev_len == c1["record"]["cum_len"]


async def test_replay_is_ok_and_a_different_row_conflicts(ledger: HttpCaptureLedger) -> None:
    """The same commit twice is fine; another admitted_at for it raises LedgerConflictError."""
    rollout_id = _fresh_id()
    c1 = _commits(rollout_id)[0]
    await ledger.record(c1)
    await ledger.record(copy.deepcopy(c1))
    changed = copy.deepcopy(c1)
    changed["record"]["admitted_at"] += 1.0
    with pytest.raises(LedgerConflictError):
        await ledger.record(changed)


async def test_failures_and_has_rows(ledger: HttpCaptureLedger) -> None:
    """A failure row alone makes has_rows true; repeating it is a no-op."""
    rollout_id = _fresh_id()
    assert await ledger.has_rows(rollout_id) is False
    await ledger.record_failure(rollout_id, "c1", "unresolved_parent")
    await ledger.record_failure(rollout_id, "c1", "unresolved_parent")
    assert await ledger.has_rows(rollout_id) is True


async def test_the_ledger_is_fenced_after_freeze(ledger: HttpCaptureLedger, store_url: str) -> None:
    """Once the rollout is frozen a record is refused with a ValueError saying frozen."""
    rollout_id = _fresh_id()
    c1, c2, _ = _commits(rollout_id)
    await ledger.record(c1)
    _freeze(store_url, rollout_id)
    with pytest.raises(ValueError, match="frozen"):
        await ledger.record(c2)


# -- staging --------------------------------------------------------------------------------------


def test_gyms_staged_records_round_trip(sink: HttpStagingSink, source: HttpStagingSource) -> None:
    """Gym's clean chain stages; fetch, extras and attachments give back exactly what was staged."""
    for staged in CLEAN.values():
        result = sink.stage(staged["record"], attachments=vector_attachments(staged["attachments"]))
        assert result.ok, result.error
    keys = list(CLEAN)
    bases = [
        StagedCallRecord.from_json(CLEAN[key]["record"]).base_snapshot().to_json() for key in keys
    ]
    assert [snapshot.to_json() for snapshot in source.fetch(keys[::-1])] == bases[::-1]
    assert [source.fetch_extras(key) for key in keys] == [
        CLEAN[key]["record"]["extras"] for key in keys
    ]
    assert source.fetch_attachments(keys[2]) == vector_attachments(CLEAN[keys[2]]["attachments"])


def test_a_wrong_prefix_mid_chain_is_refused_at_stage_time(sink: HttpStagingSink) -> None:
    """The record Gym 0.7.0 accepts on a wrong prefix is refused: cumulative_hash_mismatch."""
    wrong = vector_records("wrong_prefix_mid_chain")
    first, second = list(wrong.values())[:2]
    assert sink.stage(first["record"]).ok
    result = sink.stage(second["record"])
    assert not result.ok and result.error.startswith("cumulative_hash_mismatch")


def test_a_forged_chain_link_is_refused_at_stage_time(sink: HttpStagingSink) -> None:
    """A record whose chain hash does not extend its parent's: chain_hash_mismatch."""
    forged = vector_records("forged_parent_chain_hash")
    first, second = list(forged.values())[:2]
    assert sink.stage(first["record"]).ok
    result = sink.stage(second["record"])
    assert not result.ok and result.error.startswith("chain_hash_mismatch")


def test_staging_is_fenced_after_freeze(sink: HttpStagingSink, store_url: str) -> None:
    """Once the rollout is frozen a stage answers ok=False, saying frozen."""
    rollout_id = _fresh_id()
    first, second, _ = staged_chain(rollout_id, 3)
    assert sink.stage(first).ok
    _freeze(store_url, rollout_id)
    result = sink.stage(second)
    assert not result.ok and "frozen" in result.error


def test_a_missing_key_is_a_key_error(source: HttpStagingSource) -> None:
    """Fetching a call never staged raises KeyError naming it."""
    key = f"{_fresh_id()}/c0"
    with pytest.raises(KeyError, match=key):
        source.fetch([key])


def test_the_writer_token_cannot_fetch(store_url: str) -> None:
    """The writer token reading staged calls is refused: PermissionDeniedError (403)."""
    with HttpStagingSource(store_url, token=WRITER) as source, pytest.raises(PermissionDeniedError):
        source.fetch([f"{_fresh_id()}/c0"])


def test_many_threads_stage_through_one_sink(
    sink: HttpStagingSink, source: HttpStagingSource
) -> None:
    """16 threads staging a chain each through one sink: every call is fetchable afterwards."""
    chains = {_fresh_id(): None for _ in range(16)}
    records = {rollout_id: staged_chain(rollout_id, 4) for rollout_id in chains}
    failures: list[str] = []

    def stage(rollout_id: str) -> None:
        for record in records[rollout_id]:
            result = sink.stage(record)
            if not result.ok:
                failures.append(result.error)

    threads = [threading.Thread(target=stage, args=(rollout_id,)) for rollout_id in records]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    keys = [f"{rollout_id}/c{index}" for rollout_id in records for index in range(4)]
    assert [snapshot.staging_key for snapshot in source.fetch(keys)] == keys
