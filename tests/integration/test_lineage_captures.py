"""NeMo Gym 0.7 captures end to end: every lineage field survives every store, deltas build.

A 0.7 model server writes entries carrying its parent decisions, digests and
fingerprints, with prompts stored as deltas. They must come back from the
file store, the memory store and a real store server (through our writer
sink and http source) exactly as written, and a real finalizer must build an
unmasked record from them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.captures import agent_rollout, record_for
from tests.support.lineage import stamp_lineage
from tests.support.servers import running_app
from token_finalizer import FileTokenStore, MemoryTokenStore
from token_finalizer.api import create_app
from token_finalizer.core.entries import Snapshot
from token_finalizer.settings import settings_from_mapping
from token_finalizer.sources.http import HttpTokenSource
from token_finalizer.store_server import create_store_app
from token_finalizer_client import HttpTokenSink

pytestmark = pytest.mark.anyio

# Every optional field a 0.7 writer may stamp, with values unlike their defaults.
_ALL_LINEAGE_FIELDS = {
    "parent_resolution_reason": "",
    "response_id": "resp-{call}",
    "continuation_fingerprint": "f" * 64,
    "continuation_context_len": 3,
    "continuation_context_digest": "d" * 64,
    "fingerprint_version": 2,
    "prefix_requested": True,
    "prefix_supplied": False,
}


def _rollout(rollout_id: str) -> list[dict[str, Any]]:
    entries = agent_rollout(rollout_id, calls=4, new_tokens_per_turn=30)
    ids = [entry["model_call_id"] for entry in entries]
    parents = {call: (ids[i - 1] if i else None) for i, call in enumerate(ids)}
    stamped = stamp_lineage(entries, parents, delta=True)
    for entry in stamped:
        entry.update(
            {
                k: v.format(call=entry["model_call_id"]) if isinstance(v, str) else v
                for k, v in _ALL_LINEAGE_FIELDS.items()
            }
        )
    return stamped


def _as_written(snapshot: Snapshot) -> list[dict[str, Any]]:
    return sorted((entry.to_dict() for entry in snapshot.entries), key=lambda e: e["model_call_id"])


def _expected(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(entries, key=lambda e: e["model_call_id"])


async def _put_through_sink(url: str, entries: list[dict[str, Any]]) -> None:
    """Write `entries` as a model server does: through the writer sink to the store at `url`."""
    sink = HttpTokenSink(url=url, timeout=10.0)
    try:
        for entry in entries:
            await sink.put(entry)
    finally:
        await sink.close()


@pytest.fixture
def store_server(tmp_path: Path) -> Iterator[tuple[str, FileTokenStore]]:
    """A real store server over a file store."""
    store = FileTokenStore(tmp_path / "store")
    with running_app(create_store_app(store)) as url:
        yield url, store


@pytest.mark.parametrize("kind", ["memory", "file"])
async def test_local_stores_keep_every_lineage_field(kind: str, tmp_path: Path) -> None:
    """A frozen entry of the memory and file stores equals what the 0.7 writer put."""
    store = MemoryTokenStore() if kind == "memory" else FileTokenStore(tmp_path)
    entries = _rollout("local-1")
    for entry in entries:
        await store.put(entry)
    assert _as_written(await store.freeze("local-1")) == _expected(entries)


async def test_store_server_round_trips_every_lineage_field(
    store_server: tuple[str, FileTokenStore],
) -> None:
    """Sink -> store server -> http source: the frozen entries equal what was put."""
    url, _ = store_server
    entries = _rollout("wire-1")
    await _put_through_sink(url, entries)
    async with HttpTokenSource(url) as source:
        snapshot = await source.freeze("wire-1")
    assert _as_written(snapshot) == _expected(entries)


async def test_delta_capture_finalizes_unmasked_through_a_real_finalizer(
    store_server: tuple[str, FileTokenStore],
) -> None:
    """A delta-encoded capture behind a store server comes back as one clean, full-prompt chain."""
    url, _ = store_server
    entries = _rollout("wire-2")
    await _put_through_sink(url, entries)
    settings = settings_from_mapping({"sources": {"store": {"kind": "http", "url": url}}}, env={})
    full = agent_rollout("wire-2", calls=4, new_tokens_per_turn=30)
    with running_app(create_app(settings)) as finalizer:
        async with httpx.AsyncClient(base_url=finalizer, timeout=60.0) as client:
            answer = (await client.post("/finalize", json=record_for("wire-2"))).json()
    record = answer["record"]
    assert record.get("mask_sample") is not True, record["_ng_token_capture"]
    prompts = [item["prompt_token_ids"] for item in record["response"]["output"]]
    assert prompts == [entry["prompt_token_ids"] for entry in full]
