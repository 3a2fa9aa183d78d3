"""Token ids up to 2**64 - 1 on real servers: exact through every store, answer form and client.

The service (uvicorn) reads five sources: a file store and a Redis store
directly, and a memory, a file and a Redis store each behind its own store
server (uvicorn) through an `http` source. Every capture mixes 2**63,
2**63 + 5 and 2**64 - 1 with small ids, as a seed capture, a 0.7 lineage
capture (digests checked) and a 0.7 delta capture. Whatever the path, the
ids arrive exactly and unmasked; an id outside [0, 2**64) in a stored capture
masks the record `invalid_token_ids` (docs/records-and-builds.md#token-ids).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.support.captures import make_entry, record_for
from tests.support.redis import redis_url, unique_prefix
from tests.support.servers import running_app
from tests.support.wide_ids import cumulative, expected_items, token_items, wide_rollout
from token_finalizer import FileTokenStore, MemoryTokenStore
from token_finalizer.api import create_app
from token_finalizer.settings import settings_from_mapping
from token_finalizer.sources.redis import RedisTokenStore
from token_finalizer.store_server import create_store_app
from token_finalizer_client import AsyncFinalizerClient, BadRequestError, HttpTokenSink

pytestmark = pytest.mark.anyio

SOURCES = ("file", "redis", "via-memory", "via-file", "via-redis")
SHAPES = ("seed", "lineage", "delta")


@dataclass
class Deployment:
    """The finalizer's URL, where each source's writers write, and the raw directories."""

    finalizer_url: str
    store_urls: dict[str, str]
    redis_url: str
    redis_prefix: str
    file_dir: Path
    served_file_dir: Path

    def writer(self, source: str) -> Any:
        """A writer of `source`'s capture store: its own store, or the sink of its server."""
        if source == "file":
            return FileTokenStore(self.file_dir)
        if source == "redis":
            return RedisTokenStore(self.redis_url, key_prefix=self.redis_prefix)
        return HttpTokenSink(url=self.store_urls[source], timeout=10.0)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """Three store servers and a finalizer reading five sources."""
    url = redis_url()
    file_dir = tmp_path_factory.mktemp("direct")
    served_file_dir = tmp_path_factory.mktemp("served")
    with (
        unique_prefix(url, "wide-direct") as direct_prefix,
        unique_prefix(url, "wide-served") as served_prefix,
        running_app(create_store_app(MemoryTokenStore())) as memory_url,
        running_app(create_store_app(FileTokenStore(served_file_dir))) as file_url,
        running_app(
            create_store_app(RedisTokenStore(url, key_prefix=served_prefix))
        ) as redis_store_url,
    ):
        store_urls = {"via-memory": memory_url, "via-file": file_url, "via-redis": redis_store_url}
        sources: dict[str, Any] = {
            "default": "file",
            "file": {"kind": "file", "dir": str(file_dir)},
            "redis": {"kind": "redis", "url": url, "key_prefix": direct_prefix},
        }
        sources.update({name: {"kind": "http", "url": u} for name, u in store_urls.items()})
        with running_app(create_app(settings_from_mapping({"sources": sources}))) as base:
            yield Deployment(base, store_urls, url, direct_prefix, file_dir, served_file_dir)


async def _write(deployment: Deployment, source: str, entries: list[dict[str, Any]]) -> None:
    writer = deployment.writer(source)
    try:
        for entry in entries:
            await writer.put(entry)
    finally:
        await writer.close()


@pytest.fixture
async def finalizer(deployment: Deployment) -> AsyncIterator[httpx.AsyncClient]:
    """A raw HTTP client of the finalizer (both answer forms)."""
    async with httpx.AsyncClient(base_url=deployment.finalizer_url, timeout=60.0) as client:
        yield client


async def _captured(deployment: Deployment, source: str, shape: str, case: str) -> str:
    """Write the wide rollout of `shape` to `source`; its rollout id."""
    rollout_id = f"wide-{case}-{source}-{shape}"
    entries = wide_rollout(rollout_id, lineage=shape != "seed", delta=shape == "delta")
    await _write(deployment, source, entries)
    return rollout_id


async def _finalize(
    client: httpx.AsyncClient, rollout_id: str, source: str, tokens: str
) -> dict[str, Any]:
    response = await client.post(
        "/finalize",
        content=orjson.dumps(record_for(rollout_id)),
        params={"source": source, "tokens": tokens},
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = orjson.loads(response.content)
    return answer


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("source", SOURCES)
async def test_plain_answer_carries_the_exact_ids(
    deployment: Deployment, finalizer: httpx.AsyncClient, source: str, shape: str
) -> None:
    """The plain answer's items hold every id near 2**64 exactly, unmasked and retirable."""
    rollout_id = await _captured(deployment, source, shape, "plain")
    answer = await _finalize(finalizer, rollout_id, source, "plain")
    assert "mask_sample" not in answer["record"], answer["record"]["_ng_token_capture"]
    assert answer["retirable"] is True
    assert token_items(answer["record"]) == expected_items(rollout_id)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("source", SOURCES)
async def test_compact_answer_carries_the_exact_context(
    deployment: Deployment, finalizer: httpx.AsyncClient, source: str, shape: str
) -> None:
    """The compact answer's context holds every id exactly; prompts are prefix lengths of it."""
    rollout_id = await _captured(deployment, source, shape, "compact")
    answer = await _finalize(finalizer, rollout_id, source, "compact")
    assert "mask_sample" not in answer["record"]
    context = answer["context_token_ids"]
    assert all(type(token) is int for token in context) and context == cumulative(rollout_id)
    lengths = [
        item["prompt_token_ids"]
        for item in answer["record"]["response"]["output"]
        if "generation_token_ids" in item
    ]
    assert lengths == [len(prompt) for prompt, _ in expected_items(rollout_id)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("source", SOURCES)
async def test_client_lists_hold_the_exact_ids(
    deployment: Deployment, source: str, shape: str
) -> None:
    """The client's default record holds the exact ids as Python ints."""
    rollout_id = await _captured(deployment, source, shape, "lists")
    async with AsyncFinalizerClient(deployment.finalizer_url) as client:
        finalized = await client.finalize(record_for(rollout_id), source=source)
    assert not finalized.masked and finalized.retirable
    assert token_items(finalized.record) == expected_items(rollout_id)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("source", SOURCES)
async def test_client_numpy_views_are_exact_uint64(
    deployment: Deployment, source: str, shape: str
) -> None:
    """With as_numpy the record's token arrays are uint64 (ids need it) and exact."""
    rollout_id = await _captured(deployment, source, shape, "numpy")
    async with AsyncFinalizerClient(deployment.finalizer_url, as_numpy=True) as client:
        finalized = await client.finalize(record_for(rollout_id), source=source)
    assert not finalized.masked
    bearing = [i for i in finalized.record["response"]["output"] if "generation_token_ids" in i]
    dtypes = {str(item[key].dtype) for item in bearing for key in ("prompt_token_ids",)}
    dtypes |= {str(item["generation_token_ids"].dtype) for item in bearing}
    assert dtypes == {"uint64"}
    assert token_items(finalized.record) == expected_items(rollout_id)


# orjson cannot write 2**64, so that line is spelled out with the stdlib.
_OUT_OF_RANGE = [
    pytest.param(-5, "ValueError: token ids must be non-negative, got -5", id="negative"),
    pytest.param(
        2**64, f"ValueError: token ids must be below 2**64, got {2**64}", id="two-to-the-64"
    ),
]


@pytest.mark.parametrize(("bad", "error"), _OUT_OF_RANGE)
@pytest.mark.parametrize("source", ["file", "via-file"])
async def test_stored_id_out_of_range_masks_invalid_token_ids(
    deployment: Deployment, finalizer: httpx.AsyncClient, source: str, bad: int, error: str
) -> None:
    """A stored id below 0 or of 2**64 masks the record `invalid_token_ids`, nothing delivered."""
    rollout_id = f"bad-{source}-{'neg' if bad < 0 else 'big'}"
    directory = deployment.file_dir if source == "file" else deployment.served_file_dir
    entry = make_entry(rollout_id, "c0", [1, bad, 3], [5])
    # Written past every writer's validation, as a hand-edited or foreign file would be.
    (directory / f"{rollout_id}.tokens.jsonl").write_text(json.dumps(entry) + "\n")
    answer = await _finalize(finalizer, rollout_id, source, "compact")
    capture = answer["record"]["_ng_token_capture"]
    assert answer["record"]["mask_sample"] is True and answer["retirable"] is False
    assert capture["mask_reason"] == "invalid_token_ids"
    assert capture["error"].startswith(error)
    assert answer["record"]["response"]["output"] == record_for(rollout_id)["response"]["output"]


@pytest.mark.parametrize("bad", [-1, 2**64])
async def test_put_of_an_id_out_of_range_is_refused(deployment: Deployment, bad: int) -> None:
    """A writer putting an id outside [0, 2**64) through a store server gets a 422 naming it."""
    sink = HttpTokenSink(url=deployment.store_urls["via-file"], timeout=10.0)
    try:
        with pytest.raises(BadRequestError, match=str(bad)):
            await sink.put(make_entry("refused-put", "c0", [1, bad], [5]))
    finally:
        await sink.close()
