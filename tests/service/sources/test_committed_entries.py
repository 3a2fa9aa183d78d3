"""`committed_entries`: the read-only view lineage resolution reads, on memory, file and redis.

It lists what writers were told is stored, in put order, without freezing or
changing anything; a retired or unknown rollout has nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.captures import make_entry
from token_finalizer import CaptureCorrupt, FileTokenStore, InvalidRolloutId

pytestmark = pytest.mark.anyio


def _ids(entries: tuple[Any, ...]) -> list[str]:
    return [entry.model_call_id for entry in entries]


async def test_lists_the_calls_in_put_order(store: Any) -> None:
    """The stored calls come back in the order they were put, with their tokens."""
    for call_id in ("c9", "c1", "c5"):
        await store.put(make_entry("r1", call_id, [1], [2, 3]))
    entries = await store.committed_entries("r1")
    assert _ids(entries) == ["c9", "c1", "c5"]
    assert entries[0].generation_token_ids.tolist() == [2, 3]


async def test_an_identical_repeat_is_listed_once(store: Any) -> None:
    """A call put twice with the same payload is one entry."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    await store.put(make_entry("r1", "c1", [1], [2]))
    assert _ids(await store.committed_entries("r1")) == ["c1"]


async def test_reading_does_not_freeze(store: Any) -> None:
    """After a read the rollout still takes puts, and the next freeze holds them all."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    await store.committed_entries("r1")
    await store.put(make_entry("r1", "c2", [1, 2], [3]))
    assert _ids((await store.freeze("r1")).entries) == ["c1", "c2"]


async def test_reading_does_not_move_the_version(store: Any) -> None:
    """A read leaves the stored state exactly as it was."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    before = await store.admin.status("r1")
    await store.committed_entries("r1")
    assert await store.admin.status("r1") == before


async def test_unknown_rollout_has_none_and_stays_unknown(store: Any) -> None:
    """A rollout nobody wrote to reads as empty, and reading it creates nothing."""
    assert await store.committed_entries("never") == ()
    assert await store.admin.status("never") is None


async def test_frozen_rollout_is_still_listed(store: Any) -> None:
    """A frozen, not retired rollout lists its entries."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    await store.freeze("r1")
    assert _ids(await store.committed_entries("r1")) == ["c1"]


async def test_retired_rollout_has_none(store: Any) -> None:
    """Once its snapshot was dropped, a rollout lists nothing."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    snapshot = await store.freeze("r1")
    assert await store.drop("r1", snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    assert await store.committed_entries("r1") == ()


async def test_bad_rollout_id_is_refused(store: Any) -> None:
    """An id breaking the store id rule raises InvalidRolloutId before any read."""
    with pytest.raises(InvalidRolloutId):
        await store.committed_entries("../etc")


async def test_file_store_lists_only_acknowledged_lines(
    file_store: FileTokenStore, capture_dir: Path
) -> None:
    """A complete line past the index (its writer crashed before acknowledging) is not listed."""
    await file_store.put(make_entry("r1", "c1", [1], [2]))
    line = orjson.dumps(make_entry("r1", "c2", [1, 2], [3]), option=orjson.OPT_SORT_KEYS)
    with open(capture_dir / "r1.tokens.jsonl", "ab") as handle:
        handle.write(line + b"\n")
    assert _ids(await file_store.committed_entries("r1")) == ["c1"]


async def test_file_store_refuses_a_planted_link(
    file_store: FileTokenStore, capture_dir: Path, tmp_path: Path
) -> None:
    """A symlink planted under a capture file's name is CaptureCorrupt, as for every operation."""
    await file_store.put(make_entry("r1", "c1", [1], [2]))
    (capture_dir / "r1.tokens.intents").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CaptureCorrupt):
        await file_store.committed_entries("r1")
