"""Issue 29, item 4: garbage in Redis behind `store serve --redis` masks, never "retry" forever.

A store that holds garbage is not unreachable: the direct redis source
masks such a rollout `freeze_failed`, and the finalizer reaching the same
keys through the store server must mask it too, not read a 503 ("retrying
is safe") on every call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import redis

from tests.support.captures import make_entry, record_for
from tests.support.redis import redis_url as find_redis_url
from tests.support.redis import unique_prefix
from tests.support.servers import free_port, running_process
from tests.support.staging_stores import Conversation
from token_finalizer.core.delivery import finalize_record
from token_finalizer.sources.http import HttpTokenSource
from token_finalizer.sources.redis import RedisTokenStore

pytestmark = pytest.mark.anyio


@dataclass(frozen=True)
class Served:
    """A running `store serve --redis`: its base URL, its Redis and its key prefix."""

    base: str
    redis_url: str
    prefix: str

    def key(self, rollout_id: str, name: str) -> str:
        return f"{self.prefix}{{ng:{rollout_id}}}:{name}"


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    """`store serve --redis URL --key-prefix P` on a free port."""
    url = find_redis_url()
    port = free_port()
    with unique_prefix(url, "garbage") as prefix:
        args = ["store", "serve", "--redis", url, "--key-prefix", prefix, "--port", str(port)]
        with running_process(args, port=port):
            yield Served(f"http://127.0.0.1:{port}", url, prefix)


def _put_one_call(served: Served, rollout_id: str) -> None:
    path = f"{served.base}/ng-rollout/{rollout_id}/training-token-capture/calls/c1"
    assert httpx.put(path, json=make_entry(rollout_id, "c1", [1, 2], [3])).status_code == 200


def _state_version_not_a_number(client: redis.Redis, served: Served, rollout_id: str) -> None:
    client.hset(served.key(rollout_id, "state"), "version", "not-a-number")


def _state_a_string(client: redis.Redis, served: Served, rollout_id: str) -> None:
    client.delete(served.key(rollout_id, "state"))
    client.set(served.key(rollout_id, "state"), "garbage")


Corruption = Callable[[redis.Redis, Served, str], None]


def _corrupted(served: Served, corrupt: Corruption, rollout_id: str) -> None:
    client = redis.Redis.from_url(served.redis_url)
    try:
        corrupt(client, served, rollout_id)
    finally:
        client.close()


async def _finalized(served: Served, record: dict[str, Any], **options: Any) -> dict[str, Any]:
    """The build of `record` finalized through the store server (the http source, no retry)."""
    async with HttpTokenSource(served.base, max_retries=0) as source:
        built = await finalize_record(record, source, **options)
    assert built is not None
    return built.to_dict()


@pytest.mark.parametrize(
    "corrupt", [_state_version_not_a_number, _state_a_string], ids=["version", "state-type"]
)
async def test_garbage_behind_the_store_server_masks_the_record(
    served: Served, corrupt: Corruption
) -> None:
    """A finalize over the http source masks the rollout; the store never says "retry"."""
    rollout_id = f"garbage-{corrupt.__name__.strip('_')}"
    _put_one_call(served, rollout_id)
    _corrupted(served, corrupt, rollout_id)
    build = await _finalized(served, record_for(rollout_id))
    assert (build["mask_sample"], build["error"].startswith("SourceUnavailable: ")) == (True, True)


async def _stage_a_rollout(served: Served, rollout_id: str) -> dict[str, str]:
    """Two calls staged and committed, as a worker and a model server write them; its record."""
    chat = Conversation.of(rollout_id, 2)
    store = RedisTokenStore(served.redis_url, key_prefix=served.prefix)
    try:
        for record, row in zip(chat.records, chat.rows, strict=True):
            await store.stage(record)
            await store.record_ledger_row(rollout_id, row)
    finally:
        await store.close()
    return {"_ng_rollout_id": rollout_id, "response": {"id": "resp-c2"}}


def _staged_a_string(client: redis.Redis, served: Served, rollout_id: str) -> None:
    client.delete(served.key(rollout_id, "staged"))
    client.set(served.key(rollout_id, "staged"), "garbage")


def _ledger_a_hash(client: redis.Redis, served: Served, rollout_id: str) -> None:
    client.delete(served.key(rollout_id, "ledger"))
    client.hset(served.key(rollout_id, "ledger"), "row", "garbage")


@pytest.mark.parametrize(
    "corrupt", [_staged_a_string, _ledger_a_hash], ids=["staged-type", "ledger-type"]
)
async def test_garbage_in_a_staged_rollout_behind_the_store_server_masks_it(
    served: Served, corrupt: Corruption
) -> None:
    """A staged rollout whose staged or ledger key holds the wrong type masks; never a 503."""
    rollout_id = f"garbage-{corrupt.__name__.strip('_')}"
    record = await _stage_a_rollout(served, rollout_id)
    _corrupted(served, corrupt, rollout_id)
    build = await _finalized(served, record, raise_unreachable=True)
    assert (build["mask_sample"], build["mask_reason"]) == (True, "freeze_failed")
