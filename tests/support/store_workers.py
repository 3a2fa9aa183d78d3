"""Jobs that separate processes run against one shared store, for the concurrency tests.

Each job opens its own store (a file store over a directory, or a redis store
under a key prefix), waits for the common start instant so the processes
really race, does its part, and returns plain data for the test to judge.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tests.support.captures import make_entry
from token_finalizer import CaptureConflict, CaptureFrozen, CaptureRetired, FileTokenStore
from token_finalizer.sources.redis import RedisTokenStore

__all__ = ["Where", "announce_and_put", "drop", "freeze", "mark_incomplete", "put_until_frozen"]

# (kind, directory or redis url, key prefix)
Where = tuple[str, str, str]


def _open(where: Where) -> Any:
    kind, location, prefix = where
    if kind == "file":
        return FileTokenStore(location)
    return RedisTokenStore(location, key_prefix=prefix)


def _run(where: Where, start_at: float, job: Any) -> Any:
    async def main() -> Any:
        store = _open(where)
        try:
            await asyncio.sleep(max(0.0, start_at - time.time()))
            return await job(store)
        finally:
            await store.close()

    return asyncio.run(main())


def writer_entry(rollout_id: str, writer: int, index: int) -> dict[str, Any]:
    """The entry writer `writer` puts as its `index`th call (also what the test expects)."""
    prompt = list(range(writer * 10_000, writer * 10_000 + 50 + index))
    return make_entry(rollout_id, f"w{writer}-c{index}", prompt, [index + 1, index + 2])


def warm_up(seconds: float) -> bool:
    """Occupy one pool worker for a moment, so that every worker is started and imported."""
    time.sleep(seconds)
    return True


def announce_and_put(
    where: Where, start_at: float, rollout_id: str, writer: int, count: int
) -> dict[str, list[str]]:
    """Announce and put `count` calls, plus one call every writer shares (same payload)."""

    async def job(store: Any) -> dict[str, list[str]]:
        stored = []
        for index in range(count):
            entry = writer_entry(rollout_id, writer, index)
            await store.begin_call(rollout_id, entry["model_call_id"])
            await store.put(entry)
            stored.append(entry["model_call_id"])
            if index == count // 2:
                await store.put(make_entry(rollout_id, "shared", [7, 7], [7]))
        return {"stored": stored}

    result: dict[str, list[str]] = _run(where, start_at, job)
    return result


def conflicting_put(where: Where, start_at: float, rollout_id: str, writer: int) -> str:
    """Put call `contested` with this writer's own payload: "stored" or "conflict"."""

    async def job(store: Any) -> str:
        try:
            await store.put(make_entry(rollout_id, "contested", [1, 2], [writer + 10]))
        except CaptureConflict:
            return "conflict"
        return "stored"

    result: str = _run(where, start_at, job)
    return result


def put_until_frozen(
    where: Where, start_at: float, rollout_id: str, writer: int, count: int
) -> dict[str, list[str]]:
    """Put up to `count` calls; every call is either acknowledged or refused as frozen."""

    async def job(store: Any) -> dict[str, list[str]]:
        acked: list[str] = []
        refused: list[str] = []
        for index in range(count):
            entry = writer_entry(rollout_id, writer, index)
            try:
                await store.put(entry)
            except CaptureFrozen:
                refused.append(entry["model_call_id"])
            else:
                acked.append(entry["model_call_id"])
        return {"acked": acked, "refused": refused}

    result: dict[str, list[str]] = _run(where, start_at, job)
    return result


def freeze(
    where: Where, start_at: float, rollout_id: str, after_version: int = 0
) -> dict[str, Any]:
    """Freeze (once the capture reached `after_version`); the snapshot as plain data."""

    async def job(store: Any) -> dict[str, Any]:
        deadline = time.monotonic() + 10
        while after_version and time.monotonic() < deadline:
            state = await store.admin.status(rollout_id)
            if state is not None and state.version >= after_version:
                break
            await asyncio.sleep(0.001)
        snapshot = await store.freeze(rollout_id)
        return {
            "snapshot_id": snapshot.snapshot_id,
            "version": snapshot.version,
            "incomplete": snapshot.incomplete,
            "entries": {
                entry.model_call_id: (
                    entry.prompt_token_ids.tolist(),
                    entry.generation_token_ids.tolist(),
                )
                for entry in snapshot.entries
            },
        }

    result: dict[str, Any] = _run(where, start_at, job)
    return result


def drop(where: Where, start_at: float, rollout_id: str, snapshot_id: str, version: int) -> bool:
    """Drop that snapshot; the store's answer."""

    async def job(store: Any) -> bool:
        return bool(await store.drop(rollout_id, snapshot_id=snapshot_id, version=version))

    result: bool = _run(where, start_at, job)
    return result


def mark_incomplete(where: Where, start_at: float, rollout_id: str, model_call_id: str) -> str:
    """Mark a call failed: "marked", or "retired" when the rollout was retired first."""

    async def job(store: Any) -> str:
        try:
            await store.mark_incomplete(rollout_id, model_call_id)
        except CaptureRetired:
            return "retired"
        return "marked"

    result: str = _run(where, start_at, job)
    return result
