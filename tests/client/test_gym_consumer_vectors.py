"""Our classes reproduce what NeMo Gym's own consumer computed on them (committed vectors, no Gym).

`tests/gym_wheel/test_consumer.py` (run by hand with Gym 0.7.0 installed)
has two model-server-shaped writers record a two-call chain into our store,
then Gym's `trajectories_from_source` build it from our `HttpTokenSource`,
and writes the entries and Gym's outcome to
`tests/vectors/nemo_gym_0_7_consumer/consumer.json`. Here the same entries go
through our sink, resolver, source and finalizer, each call on a loop of
its own, and must come out as Gym saw them.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import running_app
from token_finalizer import FileTokenStore
from token_finalizer.store_server import create_store_app
from token_finalizer_client import (
    FinalizerClient,
    HttpLineageResolver,
    HttpTokenSink,
    HttpTokenSource,
    ResolutionStatus,
)

VECTOR = json.loads(
    (
        Path(__file__).resolve().parents[1] / "vectors/nemo_gym_0_7_consumer/consumer.json"
    ).read_text()
)
REQUEST = [{"role": "user", "content": "What is the weather in Paris?"}]
FOLLOW_UP = {"role": "user", "content": "And tomorrow?"}


@pytest.fixture(scope="module")
def store_url(capture_dirs: tuple[Path, Path]) -> Iterator[str]:
    """A store server over the finalizer's `local` source directory."""
    with running_app(create_store_app(FileTokenStore(capture_dirs[0]))) as url:
        yield url


def entries_of(rollout_id: str) -> list[dict[str, Any]]:
    """The vector's two entries under `rollout_id`."""
    text = json.dumps(VECTOR["entries"]).replace("consumer-r", rollout_id)
    entries: list[dict[str, Any]] = json.loads(text)
    return entries


async def record(url: str, entry: dict[str, Any]) -> None:
    """One model server's write: announce the call, then put it (a sink of its own)."""
    async with HttpTokenSink(url=url) as sink:
        await sink.begin_call(entry["rollout_id"], entry["model_call_id"])
        await sink.put(entry)


def written(url: str) -> str:
    """A fresh rollout holding the vector's chain, each call written on its own loop."""
    rollout_id = f"consumer-{uuid.uuid4().hex[:8]}"
    for entry in entries_of(rollout_id):
        asyncio.run(record(url, entry))
    return rollout_id


def test_the_continuation_resolves_to_the_first_call(store_url: str) -> None:
    """Our resolver finds the parent Gym's second server stamped (call-1)."""
    rollout_id = f"consumer-{uuid.uuid4().hex[:8]}"
    first = entries_of(rollout_id)[0]
    asyncio.run(record(store_url, first))
    items = [*REQUEST, *first["output_items"], FOLLOW_UP]

    async def resolve() -> Any:
        resolver = HttpLineageResolver(url=store_url)
        try:
            return await resolver.resolve(rollout_id, items)
        finally:
            await resolver.close()

    resolution = asyncio.run(resolve())
    assert resolution.status is ResolutionStatus.RESOLVED
    assert resolution.match is not None and resolution.match.model_call_id == "call-1"


def test_our_source_freezes_the_entries_gym_built_from(store_url: str) -> None:
    """The plain snapshot holds exactly the vector's entries, complete."""
    rollout_id = written(store_url)
    source = HttpTokenSource(store_url)
    snapshot = asyncio.run(source.freeze(rollout_id))
    asyncio.run(source.close())
    dumped = sorted((entry.model_dump() for entry in snapshot.entries), key=str)
    assert dumped == sorted(entries_of(rollout_id), key=str) and snapshot.incomplete is False


def test_our_finalize_rebuilds_the_output_gym_rebuilt(store_url: str, service_url: str) -> None:
    """`/finalize` of the record rebuilds the same token fields, item for item, as Gym did."""
    rollout_id = written(store_url)
    record_body = {"_ng_rollout_id": rollout_id, "response": VECTOR["verified_response"]}
    with FinalizerClient(service_url) as client:
        finalized = client.finalize(record_body)
    fields = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
    ours = [{k: item.get(k) for k in fields} for item in finalized.record["response"]["output"]]
    gyms = [{k: item.get(k) for k in fields} for item in VECTOR["gym"]["rebuilt_output"]]
    assert not finalized.record.get("mask_sample") and ours == gyms


def test_our_drops_answer_as_gym_saw_them(store_url: str) -> None:
    """Dropping the frozen snapshot, then again, each on a new loop: True and True."""
    rollout_id = written(store_url)
    source = HttpTokenSource(store_url)
    snapshot = asyncio.run(source.freeze(rollout_id))
    frozen = {"snapshot_id": snapshot.snapshot_id, "version": snapshot.version}
    drops = [asyncio.run(source.drop(rollout_id, **frozen)) for _ in range(2)]
    asyncio.run(source.close())
    assert drops == VECTOR["drops"]
