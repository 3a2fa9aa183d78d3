"""Staged calls 0.3.0 and 0.4.0 stored are read after the upgrade (docs/staging.md#packed-at-rest).

The stored forms are the committed vectors of `old_staged/calls.json`: the
file store's lines of 0.3.0 (columns as lists) and 0.4.0 (`columns`, base64
8-byte images), the Redis store's 0.4.0 base JSON. Read by this version they
answer what 0.4.0 answered, a call staged again is a replay, and new calls
chain onto them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.service.sources.old_staged_calls import CALLS, IDS, RID, record_of
from token_finalizer import FileTokenStore
from token_finalizer.core.errors import CaptureConflict
from token_finalizer.sources._staging import ledger_line
from token_finalizer.sources.redis import RedisTokenStore
from token_finalizer.store_server._answers import _packed_snapshot, _plain_snapshot

pytestmark = pytest.mark.anyio


def _old_directory(directory: Path, version: str, count: int) -> None:
    """A capture directory holding the first `count` calls as `version` wrote them, every row."""
    directory.mkdir(exist_ok=True)
    rows = b"".join(ledger_line(call["ledger_row"]) + b"\n" for call in CALLS)
    (directory / f"{RID}.lineage.jsonl").write_bytes(rows)
    lines = "".join(call[f"file_line_{version}"] + "\n" for call in CALLS[:count])
    (directory / f"{RID}.staged.jsonl").write_text(lines)


def _answers(version: str, form: str, count: int) -> list[bytes]:
    """0.4.0's freeze snapshots of `count` calls stored by `version`, the rest by 0.4.0."""
    suffix = {"0_3_0": "_0_3_0", "0_4_0": ""}[version]
    return [
        call[f"file_{form}_answer{suffix if index < count else ''}"].encode()
        for index, call in enumerate(CALLS)
    ]


@pytest.fixture(params=["0_3_0", "0_4_0"])
def version(request: pytest.FixtureRequest) -> str:
    """The release whose file store lines the directory holds."""
    return str(request.param)


@pytest.fixture
async def old_files(tmp_path: Path, version: str) -> AsyncIterator[FileTokenStore]:
    """A file store over a directory where `version` staged the first two calls."""
    _old_directory(tmp_path, version, 2)
    store = FileTokenStore(tmp_path)
    yield store
    await store.close()


async def test_a_new_call_chains_onto_old_lines(old_files: FileTokenStore) -> None:
    """The third call, staged now, passes custody over the two calls the old release staged."""
    last = CALLS[-1]
    assert await old_files.stage(record_of(last), last["attachments"]) is True


async def test_old_lines_freeze_as_the_old_release_answered(
    old_files: FileTokenStore, version: str
) -> None:
    """Plain and packed snapshots of old and new lines are 0.4.0's, byte for byte."""
    await old_files.stage(record_of(CALLS[-1]), CALLS[-1]["attachments"])
    await old_files.freeze(RID)
    lines = (await old_files.freeze_lines(RID)).staged.snapshots
    assert [_plain_snapshot(line) for line in lines] == _answers(version, "plain", 2)
    assert [_packed_snapshot(line) for line in lines] == _answers(version, "packed", 2)


async def test_old_lines_read_back_as_the_calls_staged(old_files: FileTokenStore) -> None:
    """The direct freeze of old lines gives each staged call's snapshot."""
    await old_files.stage(record_of(CALLS[-1]), CALLS[-1]["attachments"])
    snapshots = (await old_files.freeze(RID)).staged.snapshots
    assert list(snapshots) == [record_of(call).base_snapshot() for call in CALLS]


async def test_restaging_over_old_lines_is_a_replay(old_files: FileTokenStore) -> None:
    """Calls the old release staged, staged again now: identical replays."""
    replays = [await old_files.stage(record_of(call), call["attachments"]) for call in CALLS[:2]]
    assert replays == [False, False]


async def test_other_attachments_over_an_old_line_conflict(old_files: FileTokenStore) -> None:
    """The first call staged again with attachments it did not have is refused."""
    with pytest.raises(CaptureConflict):
        await old_files.stage(record_of(CALLS[0]), {"x": {"json": 1}})


async def test_extras_and_attachments_of_old_lines_are_read(old_files: FileTokenStore) -> None:
    """The old lines' extras and attachments come back as staged."""
    extras = await old_files.fetch_extras(RID, IDS[:2])
    attachments = await old_files.fetch_attachments(RID, IDS[1])
    assert (extras, attachments) == (
        {IDS[0]: CALLS[0]["record"]["extras"], IDS[1]: CALLS[1]["record"]["extras"]},
        CALLS[1]["attachments"],
    )


# -- Redis ------------------------------------------------------------------------------


@pytest.fixture
async def old_redis(
    redis_url: str, redis_prefix: str, raw: redis.Redis
) -> AsyncIterator[RedisTokenStore]:
    """A redis store whose first two staged calls hold the values 0.4.0 stored (base JSON)."""
    writer = RedisTokenStore(redis_url, key_prefix=redis_prefix)
    for call in CALLS[:2]:
        await writer.stage(record_of(call), call["attachments"])
    await writer.close()
    key = f"{redis_prefix}{{ng:{RID}}}:staged"
    for call in CALLS[:2]:
        raw.hset(key, call["record"]["model_call_id"], call["redis_base_0_4_0"].encode())
    store = RedisTokenStore(redis_url, key_prefix=redis_prefix)
    yield store
    await store.close()


async def _redis_frozen(store: RedisTokenStore) -> tuple[Any, ...]:
    await store.stage(record_of(CALLS[-1]), CALLS[-1]["attachments"])
    for call in CALLS:
        await store.record_ledger_row(RID, call["ledger_row"])
    await store.freeze(RID)
    return tuple((await store.freeze_lines(RID)).staged.snapshots)


async def test_old_redis_values_freeze_as_0_4_0_answered(old_redis: RedisTokenStore) -> None:
    """Old and new values answer 0.4.0's plain and packed snapshots, byte for byte."""
    lines = await _redis_frozen(old_redis)
    assert [_plain_snapshot(line) for line in lines] == [
        call["redis_base_0_4_0"].encode() for call in CALLS
    ]
    assert [_packed_snapshot(line) for line in lines] == [
        call["redis_packed_answer"].encode() for call in CALLS
    ]


async def test_restaging_over_old_redis_values_is_a_replay(old_redis: RedisTokenStore) -> None:
    """Calls 0.4.0 stored in Redis, staged again now: identical replays."""
    replays = [await old_redis.stage(record_of(call), call["attachments"]) for call in CALLS[:2]]
    assert replays == [False, False]


async def test_other_attachments_over_an_old_redis_value_conflict(
    old_redis: RedisTokenStore,
) -> None:
    """The first call staged again with other attachments is refused over its 0.4.0 value."""
    with pytest.raises(CaptureConflict):
        await old_redis.stage(record_of(CALLS[0]), {"x": {"json": 1}})


async def test_old_redis_values_fetch_as_staged(old_redis: RedisTokenStore) -> None:
    """`fetch_staged` answers the 0.4.0 values' base JSON as it is."""
    fetched = await old_redis.fetch_staged(RID, IDS[:2])
    assert list(fetched) == [call["redis_base_0_4_0"].encode() for call in CALLS[:2]]
