"""The in-memory store keeps the file store's semantics (DESIGN §4, §9)."""

from __future__ import annotations

import pytest

from tests.support.captures import make_entry
from token_finalizer import CaptureConflict, CaptureFrozen, CaptureRetired, MemoryTokenStore

pytestmark = pytest.mark.anyio


async def test_same_put_is_idempotent(memory_store: MemoryTokenStore) -> None:
    """The same payload twice stores one entry and one version bump."""
    entry = make_entry("r1", "c1", [1], [2])
    await memory_store.put(entry)
    await memory_store.put(entry)
    assert memory_store.status("r1")["version"] == 1


async def test_conflicting_put_raises_and_marks_incomplete(memory_store: MemoryTokenStore) -> None:
    """A different payload for a stored call raises and makes the snapshot incomplete."""
    await memory_store.put(make_entry("r1", "c1", [1], [2]))
    with pytest.raises(CaptureConflict):
        await memory_store.put(make_entry("r1", "c1", [1], [9]))
    assert (await memory_store.freeze("r1")).incomplete is True


async def test_put_after_freeze_fails(memory_store: MemoryTokenStore) -> None:
    """Writes after the freeze fail."""
    await memory_store.freeze("r1")
    with pytest.raises(CaptureFrozen):
        await memory_store.put(make_entry("r1", "c1", [1], [2]))


async def test_freeze_is_idempotent(memory_store: MemoryTokenStore) -> None:
    """The same snapshot identity comes back from a second freeze."""
    await memory_store.put(make_entry("r1", "c1", [1], [2]))
    first, second = await memory_store.freeze("r1"), await memory_store.freeze("r1")
    assert (first.snapshot_id, first.version) == (second.snapshot_id, second.version)


async def test_drop_is_conditional_and_repeatable(memory_store: MemoryTokenStore) -> None:
    """A stale version is refused; the matching drop succeeds, twice."""
    await memory_store.put(make_entry("r1", "c1", [1], [2]))
    snapshot = await memory_store.freeze("r1")
    assert not await memory_store.drop("r1", snapshot_id=snapshot.snapshot_id, version=0)
    assert await memory_store.drop("r1", snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    assert await memory_store.drop("r1", snapshot_id=snapshot.snapshot_id, version=snapshot.version)


async def test_freeze_after_retire_fails(memory_store: MemoryTokenStore) -> None:
    """A retired rollout cannot be frozen again."""
    snapshot = await memory_store.freeze("r1")
    await memory_store.drop("r1", snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    with pytest.raises(CaptureRetired):
        await memory_store.freeze("r1")
