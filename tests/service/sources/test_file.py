"""The file capture store's own behaviour: its files, crash recovery, processes, sweep by mtime.

The rules every store shares are in test_store_semantics.py.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
from pathlib import Path

import orjson
import pytest

from tests.support.captures import make_entry, record_for
from tests.support.packed import canonical_lines
from tests.support.stores import stored_state, swept_captures
from token_finalizer import (
    CaptureConflict,
    CaptureCorrupt,
    FileTokenStore,
    InvalidRolloutId,
    TokenEntryError,
)
from token_finalizer.core.delivery import (
    finalize_rollout_token_capture,
    retire_rollout_token_capture,
)

pytestmark = pytest.mark.anyio


def _jsonl(directory: Path, rollout_id: str = "r1") -> Path:
    return directory / f"{rollout_id}.tokens.jsonl"


def _append(directory: Path, data: bytes, rollout_id: str = "r1") -> None:
    """Append raw bytes to a capture file, as a crashed or foreign writer leaves them."""
    with open(_jsonl(directory, rollout_id), "ab") as handle:
        handle.write(data)


def _state(directory: Path, rollout_id: str = "r1") -> dict:
    return orjson.loads((directory / f"{rollout_id}.tokens.state.json").read_bytes())


async def test_put_appends_one_compact_sorted_line(
    file_store: FileTokenStore, capture_dir: Path
) -> None:
    """A put writes one line, read back as a compact sorted-key line; it indexes that
    line's digest and the file's size."""
    await file_store.put(make_entry("r1", "c1", [1], [2]))
    raw = _jsonl(capture_dir).read_bytes()
    (line,) = canonical_lines(raw)
    assert raw.count(b"\n") == 1
    assert line == orjson.dumps(orjson.loads(line), option=orjson.OPT_SORT_KEYS)
    state = _state(capture_dir)
    assert state["entry_digests"] == {"c1": hashlib.sha256(line).hexdigest()}
    assert state["indexed_size"] == len(raw)
    assert state["version"] == 1


async def test_same_put_twice_is_a_no_op(file_store: FileTokenStore, capture_dir: Path) -> None:
    """Putting the same payload again neither appends nor bumps the version."""
    entry = make_entry("r1", "c1", [1], [2])
    await file_store.put(entry)
    await file_store.put(entry)
    assert _jsonl(capture_dir).read_bytes().count(b"\n") == 1
    assert _state(capture_dir)["version"] == 1


async def test_conflicting_put_fails_and_marks_incomplete(
    file_store: FileTokenStore, capture_dir: Path
) -> None:
    """A different payload under the same call id raises and marks the rollout incomplete."""
    await file_store.put(make_entry("r1", "c1", [1], [2]))
    with pytest.raises(CaptureConflict, match="c1"):
        await file_store.put(make_entry("r1", "c1", [1], [3]))
    assert _state(capture_dir)["incomplete"] is True
    assert (capture_dir / "r1.tokens.incomplete").read_text() == "c1\n"
    assert (await file_store.freeze("r1")).incomplete is True


async def test_torn_final_line_is_cut_off(file_store: FileTokenStore, capture_dir: Path) -> None:
    """A crash mid-write leaves a torn tail that the next locked operation removes."""
    await file_store.put(make_entry("r1", "c1", [1], [2]))
    size = _jsonl(capture_dir).stat().st_size
    _append(capture_dir, b'{"rollout_id":"r1","model_call_id":"c2","prompt_tok')
    snapshot = await file_store.freeze("r1")
    assert [e.model_call_id for e in snapshot.entries] == ["c1"]
    assert _jsonl(capture_dir).stat().st_size == size


async def test_unindexed_complete_line_is_indexed(
    file_store: FileTokenStore, capture_dir: Path
) -> None:
    """A complete line written before a crash (state not yet updated) is indexed and kept."""
    await file_store.put(make_entry("r1", "c1", [1], [2]))
    line = orjson.dumps(make_entry("r1", "c2", [1, 2, 3], [4]), option=orjson.OPT_SORT_KEYS)
    _append(capture_dir, line + b"\n")
    snapshot = await file_store.freeze("r1")
    assert sorted(e.model_call_id for e in snapshot.entries) == ["c1", "c2"]
    assert _state(capture_dir)["entry_digests"]["c2"] == hashlib.sha256(line).hexdigest()


async def test_torn_middle_line_is_corruption(
    file_store: FileTokenStore, capture_dir: Path
) -> None:
    """A torn line followed by more lines is an error, not silently skipped."""
    await file_store.put(make_entry("r1", "c1", [1], [2]))
    line = orjson.dumps(make_entry("r1", "c2", [1, 2, 3], [4]), option=orjson.OPT_SORT_KEYS)
    _append(capture_dir, b'{"rollout_id":"r1","mod' + line + b"\n")
    with pytest.raises(CaptureCorrupt, match="unreadable line"):
        await file_store.freeze("r1")


async def test_drop_matching_snapshot_leaves_a_tombstone(
    file_store: FileTokenStore, capture_dir: Path
) -> None:
    """A matching drop deletes the data files and keeps a retired state."""
    await file_store.put(make_entry("r1", "c1", [1], [2]))
    await file_store.begin_call("r1", "c1")
    snapshot = await file_store.freeze("r1")
    assert await file_store.drop("r1", snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    assert sorted(p.name for p in capture_dir.iterdir()) == [
        "r1.tokens.lock",
        "r1.tokens.state.json",
    ]
    assert _state(capture_dir)["retired"] is True


async def test_drop_of_unknown_rollout_is_false(
    file_store: FileTokenStore, capture_dir: Path
) -> None:
    """Nothing stored: nothing matches, and no file is created."""
    assert not await file_store.drop("ghost", snapshot_id="x", version=1)
    assert list(capture_dir.iterdir()) == []


async def test_no_temp_files_are_left(file_store: FileTokenStore, capture_dir: Path) -> None:
    """State replacement leaves no temporary files behind."""
    for i in range(3):
        await file_store.put(make_entry("r1", f"c{i}", [1, i], [2]))
    assert not [p for p in capture_dir.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize(
    "bad", ["..", "../etc", "a/b", "a\\b", "%2e%2e", "a%2Fb", "a b", "a\x00b", "ｒ1", "é", ""]
)
async def test_bad_ids_are_refused_before_any_file(
    file_store: FileTokenStore, capture_dir: Path, bad: str
) -> None:
    """Ids outside [A-Za-z0-9._-]+ never reach the file system."""
    with pytest.raises(InvalidRolloutId):
        await file_store.freeze(bad)
    with pytest.raises(InvalidRolloutId):
        await file_store.drop(bad, snapshot_id="x", version=1)
    with pytest.raises(InvalidRolloutId):
        await file_store.mark_incomplete(bad)
    with pytest.raises(TokenEntryError):
        await file_store.put(make_entry("r1", "c1", [1], [2]) | {"rollout_id": bad})
    assert list(capture_dir.iterdir()) == []


async def test_newer_schema_line_masks_and_retires_nothing(
    file_store: FileTokenStore, capture_dir: Path
) -> None:
    """A stored entry of a newer schema masks the record and leaves the capture in place."""
    await file_store.put(make_entry("r1", "c1", [1], [2]))
    newer = orjson.dumps(
        make_entry("r1", "c2", [1, 2, 3], [4], schema_version=2), option=orjson.OPT_SORT_KEYS
    )
    _append(capture_dir, newer + b"\n")
    record = record_for("r1")
    build = await finalize_rollout_token_capture(record, file_store)
    assert build["mask_sample"] is True and build["error"].startswith("TokenEntryError: ")
    assert "schema_version 2" in build["error"]
    assert await retire_rollout_token_capture("r1", file_store, build) is False
    assert _jsonl(capture_dir).exists()


def _put_many(directory: str, writer: int, count: int) -> None:
    import asyncio

    store = FileTokenStore(directory)

    async def run() -> None:
        for i in range(count):
            prompt = list(range(writer * 1000, writer * 1000 + 200 + i))
            await store.put(make_entry("shared", f"w{writer}-c{i}", prompt, [i + 1]))

    asyncio.run(run())


async def test_concurrent_puts_from_processes_stay_intact(capture_dir: Path) -> None:
    """Four processes putting into one rollout leave every line whole and indexed."""
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_put_many, args=(str(capture_dir), w, 15)) for w in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    lines = canonical_lines(_jsonl(capture_dir, "shared").read_bytes())
    assert len(lines) == 60
    state = _state(capture_dir, "shared")
    assert state["indexed_size"] == _jsonl(capture_dir, "shared").stat().st_size
    assert {hashlib.sha256(line).hexdigest() for line in lines} == set(
        state["entry_digests"].values()
    )
    snapshot = await FileTokenStore(capture_dir).freeze("shared")
    assert len(snapshot.entries) == 60


async def test_sweep_removes_old_tombstones_only(
    file_store: FileTokenStore, capture_dir: Path
) -> None:
    """Retired tombstones past the age go; frozen unretired captures and open ones stay."""
    for rollout_id in ("retired", "frozen", "open"):
        await file_store.put(make_entry(rollout_id, "c1", [1], [2]))
    snapshot = await file_store.freeze("retired")
    await file_store.drop("retired", snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    await file_store.freeze("frozen")
    swept = await swept_captures(
        file_store, retired_older_than=60, now=os.path.getmtime(capture_dir) + 3600
    )
    assert [(s.rollout_id, s.reason) for s in swept] == [("retired", "retired")]
    assert stored_state(file_store, "retired") is None
    assert (
        stored_state(file_store, "frozen") is not None
        and stored_state(file_store, "open") is not None
    )


async def test_sweep_abandoned_only_when_asked(file_store: FileTokenStore) -> None:
    """Never-frozen quiet captures are removed only with abandoned_older_than; frozen ones never."""
    await file_store.put(make_entry("open", "c1", [1], [2]))
    await file_store.put(make_entry("frozen", "c1", [1], [2]))
    await file_store.freeze("frozen")
    later = os.path.getmtime(file_store.directory) + 3600
    assert await swept_captures(file_store, retired_older_than=60, now=later) == []
    swept = await swept_captures(
        file_store, retired_older_than=60, abandoned_older_than=60, now=later
    )
    assert [(s.rollout_id, s.reason) for s in swept] == [("open", "abandoned")]
    assert stored_state(file_store, "frozen") is not None


async def test_sweep_dry_run_removes_nothing(file_store: FileTokenStore) -> None:
    """A dry run reports what it would remove and leaves it."""
    await file_store.put(make_entry("open", "c1", [1], [2]))
    later = os.path.getmtime(file_store.directory) + 3600
    swept = await swept_captures(
        file_store, retired_older_than=60, abandoned_older_than=60, now=later, dry_run=True
    )
    assert [s.rollout_id for s in swept] == ["open"]
    assert stored_state(file_store, "open") is not None


async def test_delete_removes_every_file(file_store: FileTokenStore, capture_dir: Path) -> None:
    """The admin delete leaves nothing of the rollout behind."""
    await file_store.put(make_entry("r1", "c1", [1], [2]))
    await file_store.mark_incomplete("r1", "c2")
    await file_store.admin.delete("r1")
    assert list(capture_dir.iterdir()) == []


def test_store_option_names_the_directory_as_opened(tmp_path: Path) -> None:
    """`--dir PATH`, shell-quoted, as the store was opened (docs/records-and-builds.md#hints)."""
    assert FileTokenStore(tmp_path / "my capture").store_option == f"--dir '{tmp_path}/my capture'"
    assert FileTokenStore("./capture").store_option == "--dir capture"
