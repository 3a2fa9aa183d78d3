"""External staging in Redis: its keys under the rollout's hash tag, retention, one process's cache.

The rules shared by every store are in test_staging_*.py; this file holds
what only the redis store can show (docs/staging.md#storage).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis
from redis.cluster import key_slot

from tests.support.staging_stores import Conversation
from token_finalizer.sources.redis import STAGING_KEY_PARTS, RedisTokenStore

pytestmark = pytest.mark.anyio

RID = "r.staged"


@pytest.fixture
async def rstore(redis_url: str, redis_prefix: str) -> AsyncIterator[RedisTokenStore]:
    """A redis store under this test's prefix, abandoned captures expiring after an hour."""
    store = RedisTokenStore(redis_url, key_prefix=redis_prefix, abandoned_ttl_s=3600)
    yield store
    await store.close()


async def _write(store: RedisTokenStore, chat: Conversation) -> None:
    for record, row in zip(chat.records, chat.rows, strict=True):
        await store.stage(record, {"a": {"json": 1}})
        await store.record_ledger_row(RID, row)


def _staging_keys(raw: redis.Redis, prefix: str) -> list[str]:
    keys = (key.decode() for key in raw.scan_iter(match=prefix + "*"))
    return sorted(key for key in keys if not key.endswith(":state"))


async def test_every_staging_key_carries_the_rollouts_hash_tag(
    rstore: RedisTokenStore, raw: redis.Redis, redis_prefix: str
) -> None:
    """The seven staging keys of a rollout are `<prefix>{ng:<id>}:<part>`, one cluster slot.

    `staged_cleared` exists once a clear deleted a staged call.
    """
    await _write(rstore, Conversation.of(RID, 2))
    await rstore.clear_staged(RID, ["c1"])
    keys = _staging_keys(raw, redis_prefix)
    assert keys == sorted(f"{redis_prefix}{{ng:{RID}}}:{part}" for part in STAGING_KEY_PARTS)
    assert len({key_slot(key.encode()) for key in keys}) == 1


async def test_a_clear_keeps_the_open_rollouts_expiry_on_every_key(
    rstore: RedisTokenStore, raw: redis.Redis, redis_prefix: str
) -> None:
    """The tombstone set a clear creates expires with the rollout's other keys."""
    await _write(rstore, Conversation.of(RID, 1))
    await rstore.clear_staged(RID, ["c1"])
    cleared = f"{redis_prefix}{{ng:{RID}}}:staged_cleared"
    assert raw.smembers(cleared) == {b"c1"}
    assert 0 < raw.pttl(cleared) <= 3_600_000


async def test_an_open_staging_rollout_expires_as_a_whole(
    rstore: RedisTokenStore, raw: redis.Redis, redis_prefix: str
) -> None:
    """With abandoned_ttl_s, every staging write pushes out the expiry of all the keys."""
    await _write(rstore, Conversation.of(RID, 1))
    ttls = {raw.pttl(key) for key in _staging_keys(raw, redis_prefix)}
    assert all(0 < ttl <= 3_600_000 for ttl in ttls)


async def test_a_frozen_staging_rollout_never_expires(
    rstore: RedisTokenStore, raw: redis.Redis, redis_prefix: str
) -> None:
    """The freeze removes the expiry of every staging key: it is evidence until retired."""
    await _write(rstore, Conversation.of(RID, 1))
    await rstore.freeze(RID)
    assert {raw.pttl(key) for key in _staging_keys(raw, redis_prefix)} == {-1}


async def test_drop_deletes_every_staging_key(
    rstore: RedisTokenStore, raw: redis.Redis, redis_prefix: str
) -> None:
    """Retire leaves only the state hash (the tombstone) of the rollout."""
    await _write(rstore, Conversation.of(RID, 2))
    snapshot = await rstore.freeze(RID)
    await rstore.drop(RID, snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    assert _staging_keys(raw, redis_prefix) == []


async def test_resolution_reads_only_the_fingerprints_rows(
    rstore: RedisTokenStore, raw: redis.Redis, redis_prefix: str
) -> None:
    """The fingerprint index names exactly the committed rows of each fingerprint."""
    chat = Conversation.of(RID, 3)
    await _write(rstore, chat)
    await rstore.record_ledger_failure(RID, "c9", "unresolved_parent")
    index = raw.hgetall(f"{redis_prefix}{{ng:{RID}}}:ledger_fp")
    assert {key.decode(): value.decode() for key, value in index.items()} == {
        row["fingerprint"]: row["model_call_id"] for row in chat.rows
    }


async def test_a_new_process_checks_custody_without_a_warm_cache(
    rstore: RedisTokenStore, redis_url: str, redis_prefix: str
) -> None:
    """A second store (another process's view) reads the parent chain from Redis to check a call."""
    chat = Conversation.of(RID, 3)
    for record in chat.records[:2]:
        await rstore.stage(record)
    other = RedisTokenStore(redis_url, key_prefix=redis_prefix)
    try:
        assert await other.stage(chat.records[2]) is True
    finally:
        await other.close()
