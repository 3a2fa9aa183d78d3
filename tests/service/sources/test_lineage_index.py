"""Each store's lineage index: its resolutions equal resolution over the committed entries.

Random 0.7-shaped captures (tests.support.random_captures) are written in a
random order by two writers, as two model-server processes would write one
rollout (for the file and redis stores, two store objects over one directory
or key prefix); after every put, each request resolves through the store as
core resolution over everything committed so far answers it. A repeat with
another payload is refused by every store (CaptureConflict) and so is not
committed. The store-specific tests check what the index must notice: a
capture retired, deleted, swept or recreated, and what a resolve reads.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.captures import make_entry
from tests.support.random_captures import ROLLOUT_ID, RandomCapture, captures, resolve_requests
from tests.support.redis import redis_url, unique_prefix
from tests.support.stores import run_sync
from token_finalizer import CaptureConflict, FileTokenStore, MemoryTokenStore
from token_finalizer.core.codec import dumps_entry_line
from token_finalizer.core.entries import TokenEntry
from token_finalizer.core.lineage_resolution import Resolution, resolve_lineage
from token_finalizer.core.token_digest import token_digest
from token_finalizer.sources.base import LineageQuery, SweepRules
from token_finalizer.sources.file._capture import CaptureFiles
from token_finalizer.sources.redis import RedisTokenStore

Writers = tuple[Any, Any]  # (the resolving store, another writer of the same rollouts)


def _answer(resolution: Resolution) -> tuple[Any, ...]:
    match = resolution.match
    if match is None:
        return resolution.status, resolution.reason, None
    return (
        resolution.status,
        resolution.reason,
        (match.model_call_id, match.cumulative_token_ids.tolist(), match.digest, match.prev_len),
    )


@asynccontextmanager
async def _writers(kind: str, directory: Path) -> AsyncIterator[Writers]:
    if kind == "memory":
        store = MemoryTokenStore()
        yield store, store  # one process: the only writer is the store itself
        return
    if kind == "file":
        yield FileTokenStore(directory), FileTokenStore(directory)
        return
    url = redis_url()
    with unique_prefix(url, "index") as prefix:
        one, two = RedisTokenStore(url, key_prefix=prefix), RedisTokenStore(url, key_prefix=prefix)
        try:
            yield one, two
        finally:
            await one.close()
            await two.close()


async def _check_capture(
    kind: str,
    directory: Path,
    capture: RandomCapture,
    requests: list[tuple[str, list[str]]],
    by_other: list[bool],
) -> None:
    async with _writers(kind, directory) as (store, other):
        committed: list[TokenEntry] = []
        for index, payload in enumerate(capture.payloads):
            writer = other if by_other[index % len(by_other)] else store
            try:
                await writer.put(payload)
            except CaptureConflict:
                assert index in capture.conflicting
                continue
            committed.append(TokenEntry.from_dict(payload))
            for fingerprint, digests in requests:
                query = LineageQuery(2, fingerprint, tuple(digests))
                expected = resolve_lineage(committed, fingerprint, 2, digests)
                got = await store.resolve_lineage(ROLLOUT_ID, query)
                assert _answer(got) == _answer(expected)


@pytest.mark.parametrize("kind", ["memory", "file", "redis"])
def test_store_resolves_as_resolution_over_committed_entries(kind: str, tmp_path: Path) -> None:
    """After every put by either writer, the store answers as core resolution over its entries."""
    counter = iter(range(10**9))

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        capture=captures(max_calls=6),
        requests=resolve_requests(max_requests=3),
        by_other=st.lists(st.booleans(), min_size=1, max_size=4),
    )
    def check(
        capture: RandomCapture, requests: list[tuple[str, list[str]]], by_other: list[bool]
    ) -> None:
        directory = tmp_path / f"capture-{next(counter)}"
        run_sync(_check_capture(kind, directory, capture, requests, by_other))

    check()


# -- what each store's index notices ----------------------------------------------------


FINGERPRINT, CONTEXT = "f" * 64, "c" * 64
QUERY = LineageQuery(2, FINGERPRINT, (CONTEXT,))


def _call(call_id: str, prompt: list[int], generation: list[int], **fields: Any) -> dict[str, Any]:
    """A call the request QUERY continues."""
    return make_entry(
        ROLLOUT_ID,
        call_id,
        prompt,
        generation,
        continuation_fingerprint=FINGERPRINT,
        continuation_context_len=0,
        continuation_context_digest=CONTEXT,
        fingerprint_version=2,
        digest=token_digest([*prompt, *generation]),
        cum_len=len(prompt) + len(generation),
        **fields,
    )


@pytest.fixture(params=["memory", "file", "redis"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.anyio
async def test_a_retired_capture_resolves_over_nothing(kind: str, tmp_path: Path) -> None:
    """Once its snapshot is dropped, the rollout's index answers no_match."""
    async with _writers(kind, tmp_path) as (store, _):
        await store.put(_call("c1", [1], [2]))
        assert (await store.resolve_lineage(ROLLOUT_ID, QUERY)).status == "resolved"
        snapshot = await store.freeze(ROLLOUT_ID)
        await store.drop(ROLLOUT_ID, snapshot_id=snapshot.snapshot_id, version=snapshot.version)
        assert (await store.resolve_lineage(ROLLOUT_ID, QUERY)).reason == "no_match"


@pytest.mark.anyio
async def test_a_recreated_capture_is_indexed_afresh(kind: str, tmp_path: Path) -> None:
    """A capture deleted and written again under the same ids answers with its new tokens."""
    async with _writers(kind, tmp_path) as (store, other):
        await store.put(_call("c1", [1], [2]))
        assert (await store.resolve_lineage(ROLLOUT_ID, QUERY)).match.prev_len == 2  # type: ignore[union-attr]
        await other.admin.delete(ROLLOUT_ID)  # another process's operator
        await other.put(_call("c1", [5, 6, 7], [8]))
        resolution = await store.resolve_lineage(ROLLOUT_ID, QUERY)
        assert _answer(resolution)[2][1] == [5, 6, 7, 8]  # type: ignore[index]


@pytest.mark.anyio
async def test_a_swept_capture_is_forgotten(kind: str, tmp_path: Path) -> None:
    """A sweep that removes a retired capture leaves nothing of it to resolve."""
    async with _writers(kind, tmp_path) as (store, _):
        await store.put(_call("c1", [1], [2]))
        await store.resolve_lineage(ROLLOUT_ID, QUERY)
        snapshot = await store.freeze(ROLLOUT_ID)
        await store.drop(ROLLOUT_ID, snapshot_id=snapshot.snapshot_id, version=snapshot.version)
        await store.admin.sweep(SweepRules(retired_older_than=0.0))
        assert await store.admin.rollout_ids() == []
        assert (await store.resolve_lineage(ROLLOUT_ID, QUERY)).reason == "no_match"


@pytest.mark.anyio
async def test_file_index_reads_only_lines_appended_since_its_last_look(tmp_path: Path) -> None:
    """A second resolve reads the state and the new lines, never the rollout from the start."""
    resolver, writer = FileTokenStore(tmp_path), FileTokenStore(tmp_path)
    await writer.put(_call("c0", [1], [2]))
    await resolver.resolve_lineage(ROLLOUT_ID, QUERY)
    size = os.path.getsize(tmp_path / f"{ROLLOUT_ID}.tokens.jsonl")
    await writer.put(make_entry(ROLLOUT_ID, "c1", [1, 2, 3], [4]))
    with _reads_of(tmp_path / f"{ROLLOUT_ID}.tokens.jsonl") as offsets:
        await resolver.resolve_lineage(ROLLOUT_ID, QUERY)
    assert offsets and min(offsets) >= size


@contextmanager
def _reads_of(path: Path) -> Iterator[list[int]]:
    """Record the offsets of every positioned read of `path` (os.pread) while inside."""
    offsets: list[int] = []
    real_pread = os.pread
    target = os.stat(path).st_ino

    def recording(fd: int, length: int, offset: int) -> bytes:
        if os.fstat(fd).st_ino == target:
            offsets.append(offset)
        return real_pread(fd, length, offset)

    os.pread = recording  # type: ignore[assignment]
    try:
        yield offsets
    finally:
        os.pread = real_pread


@pytest.mark.anyio
async def test_file_index_ignores_unacknowledged_lines(tmp_path: Path) -> None:
    """A complete line past indexed_size (its writer died before acknowledging) is not listed."""
    store = FileTokenStore(tmp_path)
    await store.put(_call("c0", [1], [2]))
    line = dumps_entry_line(_call("c1", [1, 2, 3], [4]))
    with open(tmp_path / f"{ROLLOUT_ID}.tokens.jsonl", "ab") as handle:
        handle.write(line + b"\n")
    resolution = await store.resolve_lineage(ROLLOUT_ID, QUERY)
    assert resolution.match is not None and resolution.match.model_call_id == "c0"


def test_file_store_keeps_a_bounded_number_of_indexes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beyond the bound, the least recently resolved rollout's index is dropped."""
    store = FileTokenStore(tmp_path)
    monkeypatch.setattr(store._indexes, "max_rollouts", 2)

    async def scenario() -> int:
        for index in range(4):
            rollout_id = f"r{index}"
            await store.put({**_call("c1", [1], [2]), "rollout_id": rollout_id})
            await store.resolve_lineage(rollout_id, QUERY)
        return len(store._indexes)

    assert run_sync(scenario()) == 2


@contextlib.asynccontextmanager
async def _redis_store(url: str, label: str) -> AsyncIterator[RedisTokenStore]:
    """A redis store under a key prefix of its own (deleted after), closed after the block."""
    with unique_prefix(url, label) as prefix:
        store = RedisTokenStore(url, key_prefix=prefix)
        try:
            yield store
        finally:
            await store.close()


@pytest.mark.anyio
async def test_redis_capture_written_without_the_index_is_resolved_whole(
    redis_url_fixture: str,
) -> None:
    """Entries stored by a store without the index (no links) resolve over every entry, as then."""
    async with _redis_store(redis_url_fixture, "unindexed") as store:
        await store.put(_call("c1", [1], [2]))
        raw = redis.Redis.from_url(redis_url_fixture)
        try:
            raw.delete(store.keys(ROLLOUT_ID)[6], store.keys(ROLLOUT_ID)[7])
        finally:
            raw.close()
        resolution = await store.resolve_lineage(ROLLOUT_ID, QUERY)
    assert _answer(resolution)[2] == ("c1", [1, 2], token_digest([1, 2]), 2)


@pytest.mark.anyio
async def test_redis_resolve_script_sends_only_the_answers_delta_chain(
    redis_url_fixture: str,
) -> None:
    """The script returns the lines of the chosen call's chain, none of the rest of the rollout."""
    async with _redis_store(redis_url_fixture, "script") as store:
        await store.put(make_entry(ROLLOUT_ID, "other", [9, 9], [9]))
        await store.put(make_entry(ROLLOUT_ID, "a", [1], [2]))
        delta = _call("b", [3], [4], prompt_is_delta=True, parent_call_id="a")
        delta.update(
            parent_resolution="resolved",
            digest=token_digest([1, 2, 3, 4]),
            cum_len=4,
        )
        await store.put(delta)
        reply = await store._redis.run(
            "resolve",
            ROLLOUT_ID,
            ("candidates", "", 10_000, 0, FINGERPRINT, CONTEXT),
            "test",
        )
    status, _epoch, candidates, _links, lines = reply
    assert status == b"ok" and candidates[0] == b"b"
    assert sorted(lines[0::2]) == [b"a", b"b"]


@pytest.fixture
def redis_url_fixture() -> str:
    """The URL of the test Redis."""
    return redis_url()


def test_file_resolve_on_the_event_loop_gives_way_to_a_writer(tmp_path: Path) -> None:
    """While a writer holds the rollout's lock, the quick path declines (the caller waits in a
    worker thread) instead of blocking; once the lock is free it answers."""
    store = FileTokenStore(tmp_path)
    run_sync(store.put(_call("c1", [1], [2])))
    with CaptureFiles(tmp_path, ROLLOUT_ID).locked(exclusive=True):
        assert store._resolve_lineage(ROLLOUT_ID, QUERY, inline=True) is None
    quick = store._resolve_lineage(ROLLOUT_ID, QUERY, inline=True)
    assert quick is not None and quick.status == "resolved"
