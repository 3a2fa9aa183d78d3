"""Many finalizes at once: distinct rollouts, and one rollout finalized by several callers.

These stay on a real uvicorn server (`served_url`): each caller has its own
connection, so the requests really overlap as they would in production.
"""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest

from tests.support.captures import agent_rollout, record_for
from token_finalizer import FileTokenStore

pytestmark = pytest.mark.anyio


async def _finalize_all(base: str, rollout_ids: list[str]) -> list[httpx.Response]:
    responses: list[Any] = [None] * len(rollout_ids)
    limits = httpx.Limits(max_connections=len(rollout_ids))
    async with httpx.AsyncClient(base_url=base, timeout=60.0, limits=limits) as client:

        async def one(index: int, rollout_id: str) -> None:
            responses[index] = await client.post("/finalize", json=record_for(rollout_id))

        async with anyio.create_task_group() as group:
            for index, rollout_id in enumerate(rollout_ids):
                group.start_soon(one, index, rollout_id)
    return responses


async def _write(store: FileTokenStore, rollout_ids: list[str]) -> None:
    for rollout_id in rollout_ids:
        for entry in agent_rollout(rollout_id, calls=3, new_tokens_per_turn=40):
            await store.put(entry)


async def test_fifty_distinct_rollouts_at_once(served_url: str, file_store: FileTokenStore) -> None:
    """50 concurrent finalizes of distinct rollouts all answer 200 with their own rebuilt record."""
    rollout_ids = [f"r-{i}" for i in range(50)]
    await _write(file_store, rollout_ids)
    responses = await _finalize_all(served_url, rollout_ids)
    answered = [(r.status_code, r.json()["rollout_id"], r.json()["retirable"]) for r in responses]
    assert answered == [(200, rollout_id, True) for rollout_id in rollout_ids]


async def test_ten_callers_of_one_rollout_share_one_snapshot(
    served_url: str, file_store: FileTokenStore
) -> None:
    """10 concurrent finalizes of one rollout: no 5xx, and all name the same snapshot."""
    await _write(file_store, ["shared"])
    responses = await _finalize_all(served_url, ["shared"] * 10)
    snapshots = {
        (r.status_code, r.json()["build"]["_capture_snapshot"]["snapshot_id"]) for r in responses
    }
    versions = {r.json()["build"]["_capture_snapshot"]["version"] for r in responses}
    assert (len(snapshots), next(iter(snapshots))[0], len(versions)) == (1, 200, 1)


async def test_concurrent_same_rollout_builds_agree(
    served_url: str, file_store: FileTokenStore
) -> None:
    """10 concurrent finalizes of one rollout return identical records."""
    await _write(file_store, ["shared"])
    responses = await _finalize_all(served_url, ["shared"] * 10)
    records = [r.json()["record"] for r in responses]
    assert all(record == records[0] for record in records)
