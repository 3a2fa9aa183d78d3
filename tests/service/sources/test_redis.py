"""The redis store's own behaviour: key layout, stored bytes, TTLs, failures, configuration.

The rules it shares with the other stores are in test_store_semantics.py.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import redis
from redis.asyncio import Redis, RedisCluster
from redis.crc import key_slot

from tests.support.captures import make_entry, record_for
from tests.support.servers import free_port
from token_finalizer import (
    CaptureCorrupt,
    InvalidRolloutId,
    SourceUnavailable,
    TokenEntryError,
    open_source,
)
from token_finalizer._constants import DEFAULT_RETIRED_TTL_S
from token_finalizer.core.codec import dumps_entry_line
from token_finalizer.core.delivery import (
    finalize_rollout_token_capture,
    retire_rollout_token_capture,
)
from token_finalizer.core.errors import StoreUnreachable
from token_finalizer.core.redaction import redacted_url
from token_finalizer.core.store_urls import check_key_prefix, check_redis_url
from token_finalizer.service.metrics import ServiceMetrics
from token_finalizer.service.registry import SourceRegistry
from token_finalizer.settings import ConfigError, settings_from_mapping
from token_finalizer.sources._packed import expand_lines, is_packed
from token_finalizer.sources.base import SweepRules
from token_finalizer.sources.redis import ENTRY_KEY_PARTS, RedisTokenStore

pytestmark = pytest.mark.anyio

PASSWORD = "hunter2-s3cret"
# Lineage stamps that make a call a candidate of the lineage index.
STAMPED = {
    "continuation_fingerprint": "a" * 64,
    "continuation_context_len": 1,
    "continuation_context_digest": "b" * 64,
    "fingerprint_version": 2,
}


@pytest.fixture
async def rstore(redis_url: str, redis_prefix: str) -> AsyncIterator[RedisTokenStore]:
    """A redis store under this test's prefix, default retention."""
    store = RedisTokenStore(redis_url, key_prefix=redis_prefix)
    yield store
    await store.close()


def _keys(raw: redis.Redis, prefix: str) -> list[str]:
    return sorted(key.decode() for key in raw.scan_iter(match=prefix + "*"))


def _dead_url(password: str | None = None) -> str:
    auth = f":{password}@" if password else ""
    return f"redis://{auth}127.0.0.1:{free_port()}/0"


# -- key layout and stored bytes ----------------------------------------------------------------


async def test_every_key_of_a_rollout_carries_its_hash_tag(
    rstore: RedisTokenStore, raw: redis.Redis, redis_prefix: str
) -> None:
    """All eight token-capture keys of a rollout are `<prefix>{ng:<id>}:<part>` (one slot)."""
    await rstore.begin_call("r.1", "c2")
    # Stamped for lineage, so the index keys exist too.
    await rstore.put(make_entry("r.1", "c1", [1], [2], **STAMPED))
    await rstore.mark_incomplete("r.1", "c3")
    keys = _keys(raw, redis_prefix)
    assert keys == sorted(f"{redis_prefix}{{ng:r.1}}:{part}" for part in ENTRY_KEY_PARTS)
    assert len({key_slot(key.encode()) for key in keys}) == 1


async def test_put_stores_the_line_as_written_and_its_digest(
    rstore: RedisTokenStore, raw: redis.Redis
) -> None:
    """The entries hash holds the entry packed, read back as the compact sorted-key line;
    digests hold that line's sha256."""
    entry = make_entry("r1", "c1", [1, 2], [3])
    await rstore.put(entry)
    entries, digests, _order, *_ = rstore.keys("r1")[1:]
    line = dumps_entry_line(entry)
    stored = raw.hget(entries, "c1")
    assert isinstance(stored, bytes) and is_packed(stored)
    assert expand_lines([stored]) == (line,)
    assert raw.hget(digests, "c1") == hashlib.sha256(line).hexdigest().encode()


async def test_freeze_lines_hands_back_the_stored_bytes(rstore: RedisTokenStore) -> None:
    """The store server's fast path gets the lines unparsed, in put order."""
    entries = [make_entry("r1", f"c{i}", [1, i], [2]) for i in (3, 1, 2)]
    for entry in entries:
        await rstore.put(entry)
    frozen = await rstore.freeze_lines("r1")
    assert frozen.lines == tuple(dumps_entry_line(entry) for entry in entries)
    snapshot = await rstore.freeze("r1")
    assert (frozen.snapshot_id, frozen.version) == (snapshot.snapshot_id, snapshot.version)


async def test_key_prefixes_keep_stores_apart(redis_url: str, redis_prefix: str) -> None:
    """Two prefixes on one Redis are two separate stores."""
    one = RedisTokenStore(redis_url, key_prefix=redis_prefix + "a:")
    two = RedisTokenStore(redis_url, key_prefix=redis_prefix + "b:")
    try:
        await one.put(make_entry("r1", "c1", [1], [2]))
        assert (await two.freeze("r1")).entries == ()
        assert await one.admin.rollout_ids() == ["r1"]
    finally:
        await one.close()
        await two.close()


async def test_delete_and_sweep_remove_the_lineage_index_too(
    rstore: RedisTokenStore, raw: redis.Redis, redis_prefix: str
) -> None:
    """An operator's delete, and a sweep of a retired capture, leave no index key behind."""
    await rstore.put(make_entry("r1", "c1", [1], [2], **STAMPED))
    await rstore.admin.delete("r1")
    assert _keys(raw, redis_prefix) == []
    await rstore.put(make_entry("r2", "c1", [1], [2], **STAMPED))
    snapshot = await rstore.freeze("r2")
    await rstore.drop("r2", snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    await rstore.admin.sweep(SweepRules(retired_older_than=0.0))
    assert _keys(raw, redis_prefix) == []


async def test_refused_ids_write_no_key(
    rstore: RedisTokenStore, raw: redis.Redis, redis_prefix: str
) -> None:
    """An id is checked before any key is built: nothing reaches Redis."""
    for bad in ("a}b", "{ng:x}", "a b", "../x"):
        with pytest.raises(InvalidRolloutId):
            await rstore.freeze(bad)
    for bad in ("a\nb", "\x00", ""):
        with pytest.raises(InvalidRolloutId):
            await rstore.begin_call("r1", bad)
    assert _keys(raw, redis_prefix) == []


async def test_call_ids_are_hash_fields_never_key_names(
    rstore: RedisTokenStore, raw: redis.Redis, redis_prefix: str
) -> None:
    """A call id holding `{`, `}`, `:` and `/` adds no key: it is a field of the rollout's keys."""
    call_id = "{ng:x}/a}b:c"
    await rstore.begin_call("r1", call_id)
    await rstore.put(make_entry("r1", call_id, [1], [2]))
    await rstore.mark_incomplete("r1", call_id)
    keys = _keys(raw, redis_prefix)
    assert keys and all(key.startswith(f"{redis_prefix}{{ng:r1}}:") for key in keys)
    assert not [key for key in keys if call_id in key]


# -- retention ----------------------------------------------------------------------------------


async def test_drop_keeps_only_the_state_as_an_expiring_tombstone(
    redis_url: str, redis_prefix: str, raw: redis.Redis
) -> None:
    """A drop deletes the data and index keys; the state stays, expiring after retired_ttl_s."""
    store = RedisTokenStore(redis_url, key_prefix=redis_prefix, retired_ttl_s=100)
    await store.put(make_entry("r1", "c1", [1], [2], **STAMPED))
    await store.begin_call("r1", "c1")
    await store.mark_incomplete("r1", "c9")
    snapshot = await store.freeze("r1")
    assert await store.drop("r1", snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    await store.close()
    state = store.keys("r1")[0]
    assert _keys(raw, redis_prefix) == [state]
    assert 0 < raw.pttl(state) <= 100_000


async def test_tombstones_are_kept_forever_without_retired_ttl(
    redis_url: str, redis_prefix: str, raw: redis.Redis
) -> None:
    """retired_ttl_s=None leaves the tombstone without an expiry."""
    store = RedisTokenStore(redis_url, key_prefix=redis_prefix, retired_ttl_s=None)
    snapshot = await store.freeze("r1")
    await store.drop("r1", snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    await store.close()
    assert raw.pttl(store.keys("r1")[0]) == -1


async def test_open_captures_do_not_expire_by_default(
    rstore: RedisTokenStore, raw: redis.Redis, redis_prefix: str
) -> None:
    """Without abandoned_ttl_s no key of an open capture expires."""
    await rstore.begin_call("r1", "c2")
    await rstore.put(make_entry("r1", "c1", [1], [2]))
    assert {raw.pttl(key) for key in _keys(raw, redis_prefix)} == {-1}


async def test_abandoned_ttl_covers_every_key_of_an_open_capture(
    redis_url: str, redis_prefix: str, raw: redis.Redis
) -> None:
    """With abandoned_ttl_s each write gives every key of the capture the same expiry."""
    store = RedisTokenStore(redis_url, key_prefix=redis_prefix, abandoned_ttl_s=60)
    await store.put(make_entry("r1", "c1", [1], [2], **STAMPED))
    await store.begin_call("r1", "c2")
    await store.mark_incomplete("r1", "c3")
    await store.close()
    ttls = [raw.pttl(key) for key in _keys(raw, redis_prefix)]
    assert len(ttls) == len(ENTRY_KEY_PARTS) and all(55_000 < ttl <= 60_000 for ttl in ttls)
    assert max(ttls) - min(ttls) < 1000


async def test_abandoned_capture_disappears_whole(redis_url: str, redis_prefix: str) -> None:
    """A capture nobody writes to for abandoned_ttl_s is gone: the next freeze is empty."""
    store = RedisTokenStore(redis_url, key_prefix=redis_prefix, abandoned_ttl_s=0.2)
    await store.begin_call("r1", "c2")
    await store.put(make_entry("r1", "c1", [1], [2]))
    await asyncio.sleep(0.4)
    assert await store.admin.status("r1") is None
    snapshot = await store.freeze("r1")
    await store.close()
    assert (snapshot.entries, snapshot.incomplete, snapshot.version) == ((), False, 1)


async def test_freeze_removes_the_abandoned_ttl(
    redis_url: str, redis_prefix: str, raw: redis.Redis
) -> None:
    """A frozen capture is evidence: the freeze clears every expiry, a late mark sets none."""
    store = RedisTokenStore(redis_url, key_prefix=redis_prefix, abandoned_ttl_s=60)
    await store.begin_call("r1", "c2")
    await store.put(make_entry("r1", "c1", [1], [2]))
    await store.freeze("r1")
    await store.mark_incomplete("r1", "c3")
    await store.close()
    assert {raw.pttl(key) for key in _keys(raw, redis_prefix)} == {-1}


# -- damaged data ----------------------------------------------------------------------------------


async def _stored_beside_c1(
    rstore: RedisTokenStore, raw: redis.Redis, entry: dict[str, Any], line: bytes
) -> str:
    """Put r1/c1, then write `line` as the stored entry of `entry`'s call behind the
    store's back (listed in r1's order); the entries hash's key."""
    await rstore.put(make_entry("r1", "c1", [1], [2]))
    _state, entries, _digests, order, *_ = rstore.keys("r1")
    raw.hset(entries, entry["model_call_id"], line)
    raw.rpush(order, entry["model_call_id"])
    return entries


async def test_listed_call_without_entry_is_corrupt(
    rstore: RedisTokenStore, raw: redis.Redis
) -> None:
    """An order entry whose line is missing raises CaptureCorrupt naming the call."""
    await rstore.put(make_entry("r1", "c1", [1], [2]))
    raw.rpush(rstore.keys("r1")[3], "c9")
    with pytest.raises(CaptureCorrupt, match="c9"):
        await rstore.freeze("r1")


async def test_entry_of_another_rollout_is_refused(
    rstore: RedisTokenStore, raw: redis.Redis
) -> None:
    """A stored line naming another rollout raises TokenEntryError."""
    other = make_entry("r2", "c2", [1], [2])
    await _stored_beside_c1(rstore, raw, other, dumps_entry_line(other))
    with pytest.raises(TokenEntryError, match="r2"):
        await rstore.freeze("r1")


async def test_newer_schema_line_masks_and_retires_nothing(
    rstore: RedisTokenStore, raw: redis.Redis
) -> None:
    """A stored entry of a newer schema masks the record and leaves the capture in place."""
    newer = make_entry("r1", "c2", [1, 2, 3], [4], schema_version=2)
    line = orjson.dumps(newer, option=orjson.OPT_SORT_KEYS)
    entries = await _stored_beside_c1(rstore, raw, newer, line)
    build = await finalize_rollout_token_capture(record_for("r1"), rstore)
    assert build["mask_sample"] is True and "schema_version 2" in build["error"]
    assert await retire_rollout_token_capture("r1", rstore, build) is False
    assert raw.hexists(entries, "c1")


# -- reachability and connections ------------------------------------------------------------------


async def test_unreachable_redis_is_source_unavailable_for_every_operation() -> None:
    """Nothing listening: each operation raises StoreUnreachable naming the store (retried
    until the deadline first), and the ping names the node."""
    store = RedisTokenStore(_dead_url(), timeout_s=0.3)
    attempts = (
        lambda: store.put(make_entry("r1", "c1", [1], [2])),
        lambda: store.begin_call("r1", "c1"),
        lambda: store.mark_incomplete("r1"),
        lambda: store.freeze("r1"),
        lambda: store.drop("r1", snapshot_id="x", version=1),
        lambda: store.admin.status("r1"),
        lambda: store.admin.rollout_ids(),
    )
    for attempt in attempts:
        with pytest.raises(StoreUnreachable, match=r"redis store redis://127\.0\.0\.1:\d+/0"):
            await attempt()
    with pytest.raises(StoreUnreachable, match=r"^redis node 127\.0\.0\.1:\d+: ConnectionError"):
        await store.ping()
    await store.close()


async def test_messages_never_show_the_password() -> None:
    """A password in the URL appears in no error message and no repr."""
    store = RedisTokenStore(_dead_url(PASSWORD), timeout_s=1)
    with pytest.raises(SourceUnavailable) as failure:
        await store.freeze("r1")
    await store.close()
    assert PASSWORD not in str(failure.value) and PASSWORD not in repr(store)


async def test_refused_login_is_source_unavailable(redis_url: str) -> None:
    """A Redis refusing the credentials answers SourceUnavailable, password hidden."""
    url = redis_url.replace("redis://", f"redis://nobody-{PASSWORD}:{PASSWORD}@", 1)
    store = RedisTokenStore(url, timeout_s=2)
    with pytest.raises(SourceUnavailable) as failure:
        await store.ping()
    await store.close()
    assert PASSWORD not in str(failure.value)


async def test_ping_answers_when_reachable(rstore: RedisTokenStore) -> None:
    """A reachable Redis answers the ping."""
    await rstore.ping()


async def test_closed_store_refuses_and_closes_twice(redis_url: str) -> None:
    """After close every call is SourceUnavailable; a second close is harmless."""
    store = RedisTokenStore(redis_url)
    await store.close()
    await store.close()
    with pytest.raises(SourceUnavailable, match="closed"):
        await store.freeze("r1")


def test_cluster_option_builds_a_cluster_client() -> None:
    """cluster=True talks through redis-py's cluster client (which routes by slot)."""
    store = RedisTokenStore("redis://127.0.0.1:7000/0", cluster=True)
    assert isinstance(store._redis.redis.client, RedisCluster)


async def test_a_client_passed_in_stays_open(redis_url: str, redis_prefix: str) -> None:
    """A store over the caller's client does not close that client."""
    client = Redis.from_url(redis_url)
    store = RedisTokenStore(key_prefix=redis_prefix, client=client)
    await store.freeze("r1")
    await store.close()
    assert await client.ping() is True
    await client.aclose()


async def test_registry_reports_a_redis_source_reachable_or_not(redis_url: str) -> None:
    """The service's /ready probe pings redis sources like any other."""
    settings = settings_from_mapping(
        {
            "sources": {
                "default": "up",
                "up": {"kind": "redis", "url": redis_url},
                "down": {"kind": "redis", "url": _dead_url(PASSWORD), "timeout_s": 0.5},
            }
        }
    )
    registry = SourceRegistry.open(settings, ServiceMetrics())
    try:
        reachability = await registry.reachability()
    finally:
        await registry.close()
    assert reachability["up"]["reachable"] is True and "status" not in reachability["up"]
    assert reachability["down"]["reachable"] is False
    assert reachability["down"]["error"].startswith("redis node 127.0.0.1:")
    assert PASSWORD not in reachability["down"]["error"]


# -- configuration ---------------------------------------------------------------------------------


def test_open_source_builds_a_redis_store(redis_url: str) -> None:
    """`kind: redis` opens a RedisTokenStore with the configured prefix."""
    store: Any = open_source("redis", url=redis_url, key_prefix="tf:")
    assert isinstance(store, RedisTokenStore) and store.key_prefix == "tf:"


def test_settings_accept_a_redis_source() -> None:
    """url, key_prefix, timeout_s, the TTLs and the memory rules reach the store's options."""
    settings = settings_from_mapping(
        {
            "sources": {
                "shared": {
                    "kind": "redis",
                    "url": "rediss://:${REDIS_PASSWORD}@redis:6380/2",
                    "key_prefix": "ng:",
                    "timeout_s": 3,
                    "abandoned_ttl_s": 86400,
                    "retired_ttl_s": None,
                    "memory_high_water": 0.8,
                    "allow_eviction": True,
                }
            }
        },
        env={"REDIS_PASSWORD": PASSWORD},
    )
    assert settings.sources["shared"].open_options() == {
        "urls": (f"rediss://:{PASSWORD}@redis:6380/2",),
        "cluster": False,
        "min_replicas_acked": 0,
        "key_prefix": "ng:",
        "timeout_s": 3.0,
        "retired_ttl_s": None,
        "abandoned_ttl_s": 86400.0,
        "memory_high_water": 0.8,
        "allow_eviction": True,
    }


def test_settings_default_tombstone_ttl_is_the_stores() -> None:
    """Left out, retired_ttl_s is the store's own default (7 days)."""
    settings = settings_from_mapping({"sources": {"s": {"kind": "redis", "url": "redis://r"}}})
    assert settings.sources["s"].retired_ttl_s == DEFAULT_RETIRED_TTL_S == 7 * 86_400


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"kind": "redis"}, "needs `url`"),
        ({"kind": "redis", "url": f"http://:{PASSWORD}@r:1"}, "must start with redis://"),
        ({"kind": "redis", "url": "redis://r", "key_prefix": "{tf}"}, "no braces"),
        ({"kind": "redis", "url": "redis://r", "token": "t"}, "takes no `token`"),
        ({"kind": "redis", "url": "redis://r", "abandoned_ttl_s": 0}, "abandoned_ttl_s"),
    ],
)
def test_settings_refuse_a_bad_redis_source(source: dict[str, Any], message: str) -> None:
    """A bad redis source fails at start-up naming the problem, never the password."""
    with pytest.raises(ConfigError, match=message) as failure:
        settings_from_mapping({"sources": {"s": source}})
    assert PASSWORD not in str(failure.value)


@pytest.mark.parametrize("prefix", ["{tf}", "a b", "tf*", "é"])
def test_key_prefix_outside_the_safe_characters_is_refused(prefix: str) -> None:
    """Braces would move the hash tag, glob characters would break the key scan."""
    with pytest.raises(ValueError, match="key_prefix"):
        check_key_prefix(prefix)


def test_urls_are_shown_without_credentials_or_query() -> None:
    """The shown URL keeps scheme, host, port and db only."""
    shown = redacted_url(f"rediss://user:{PASSWORD}@cache.example:6380/3?password={PASSWORD}")
    assert shown == "rediss://cache.example:6380/3"
    with pytest.raises(ValueError, match="names no host"):
        check_redis_url("redis:///0")


# -- how operators' commands name the store (hints) --------------------------------------------


async def test_store_option_names_the_url_and_prefix_without_the_password() -> None:
    """`--redis URL --key-prefix P` as the store was opened, the URL's password left out."""
    store = RedisTokenStore(_dead_url(PASSWORD), key_prefix="ng:", timeout_s=1)
    await store.close()
    option = store.store_option
    assert PASSWORD not in option
    assert option.startswith("--redis redis://127.0.0.1:") and option.endswith(
        "/0 --key-prefix ng:"
    )


async def test_store_option_of_a_store_without_a_prefix_is_the_url_alone(redis_url: str) -> None:
    """No key prefix: `--redis URL` and nothing more."""
    store = RedisTokenStore(redis_url)
    await store.close()
    assert store.store_option == f"--redis {redis_url}"
