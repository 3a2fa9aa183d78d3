"""The file store in a hostile directory: planted links, FIFOs and stray names; killed writers.

Each test builds the hostile situation on disk and checks the promise: nothing
outside the capture directory is read, written or created; a finalize masks
promptly; a sweep skips what it cannot trust and sweeps the rest.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.support.asgi import in_process
from tests.support.captures import make_entry, record_for
from tests.support.stores import stored_state, sweep, swept_captures
from token_finalizer import CaptureCorrupt, CaptureRetired, FileTokenStore
from token_finalizer.core.delivery import finalize_rollout_token_capture
from token_finalizer.sources.file._capture import CaptureFiles
from token_finalizer.store_server import create_store_app

pytestmark = pytest.mark.anyio

KINDS = ("jsonl", "state.json", "lock", "intents", "incomplete")
OUTSIDE_BYTES = b"precious bytes outside the capture directory\nand a last line without newline"
HOUR = 3600.0


def _name(rollout_id: str, kind: str) -> str:
    return f"{rollout_id}.tokens.{kind}"


def _snapshot(path: Path) -> tuple[bytes, int, float]:
    info = path.stat()
    return path.read_bytes(), info.st_size, info.st_mtime


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file outside the capture directory that nothing may touch."""
    path = tmp_path / "outside" / "precious.txt"
    path.parent.mkdir()
    path.write_bytes(OUTSIDE_BYTES)
    return path


async def _finalize(store: FileTokenStore, rollout_id: str) -> dict:
    build = await finalize_rollout_token_capture(record_for(rollout_id), store)
    assert build is not None
    return build


def _assert_masked_naming(build: dict, name: str, tmp_path: Path) -> None:
    assert build["mask_sample"] is True
    assert build["error"].startswith("CaptureCorrupt: ")
    assert name in build["error"]
    assert str(tmp_path) not in build["error"]  # never where a link points


# -- item 5: planted symlinks ------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_symlink_to_an_outside_file_is_refused(
    file_store: FileTokenStore, capture_dir: Path, outside: Path, tmp_path: Path, kind: str
) -> None:
    """Finalize masks, a put fails (store and server), and the outside file keeps every byte."""
    before = _snapshot(outside)
    (capture_dir / _name("r1", kind)).symlink_to(outside)
    _assert_masked_naming(await _finalize(file_store, "r1"), _name("r1", kind), tmp_path)
    with pytest.raises(CaptureCorrupt, match=_name("r1", kind).replace(".", r"\.")):
        await file_store.put(make_entry("r1", "c1", [1], [2]))
    with pytest.raises(CaptureCorrupt):
        await file_store.begin_call("r1", "c2")
    with pytest.raises(CaptureCorrupt):
        await file_store.mark_incomplete("r1", "c3")
    with in_process(create_store_app(file_store)) as http:
        put = http.put(
            "/ng-rollout/r1/training-token-capture/calls/c1", json=make_entry("r1", "c1", [1], [2])
        )
        freeze = http.post("/ng-rollout/r1/training-token-capture/freeze")
    assert (put.status_code, freeze.status_code) == (500, 500)
    assert str(tmp_path) not in put.text
    assert _snapshot(outside) == before
    assert sorted(p.name for p in outside.parent.iterdir()) == ["precious.txt"]


@pytest.mark.parametrize("kind", KINDS)
async def test_dangling_symlink_creates_nothing_outside(
    file_store: FileTokenStore, capture_dir: Path, tmp_path: Path, kind: str
) -> None:
    """A link to a path that does not exist yet: no operation creates that path."""
    target = tmp_path / "outside-created"
    (capture_dir / _name("r1", kind)).symlink_to(target)
    with pytest.raises(CaptureCorrupt, match="symbolic link"):
        await file_store.put(make_entry("r1", "c1", [1], [2]))
    _assert_masked_naming(await _finalize(file_store, "r1"), _name("r1", kind), tmp_path)
    assert not os.path.lexists(target)


@pytest.mark.parametrize("kind", ["jsonl", "state.json", "intents"])
async def test_symlink_planted_into_a_live_capture_is_refused(
    file_store: FileTokenStore, capture_dir: Path, outside: Path, tmp_path: Path, kind: str
) -> None:
    """A link swapped in for a file of a capture that was being written: refused, not followed."""
    await file_store.put(make_entry("r1", "c1", [1], [2]))
    await file_store.begin_call("r1", "c1")
    before = _snapshot(outside)
    planted = capture_dir / _name("r1", kind)
    planted.unlink()
    planted.symlink_to(outside)
    _assert_masked_naming(await _finalize(file_store, "r1"), _name("r1", kind), tmp_path)
    with pytest.raises(CaptureCorrupt):
        await file_store.put(make_entry("r1", "c2", [1, 2, 3], [4]))
    assert _snapshot(outside) == before


async def test_symlinked_directory_is_never_followed(
    file_store: FileTokenStore, capture_dir: Path, tmp_path: Path
) -> None:
    """A link to an outside directory under a capture file's name: refused, the directory stays."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_bytes(b"x")
    for kind in KINDS:
        (capture_dir / _name(f"d-{kind}", kind)).symlink_to(elsewhere, target_is_directory=True)
        with pytest.raises(CaptureCorrupt):
            await file_store.put(make_entry(f"d-{kind}", "c1", [1], [2]))
        build = await _finalize(file_store, f"d-{kind}")
        assert build["mask_sample"] is True and "CaptureCorrupt" in build["error"]
    (capture_dir / "real-dir.tokens.jsonl").mkdir()
    with pytest.raises(CaptureCorrupt, match="a directory"):
        await file_store.put(make_entry("real-dir", "c1", [1], [2]))
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep"]


@pytest.mark.parametrize("content", [b"", b"a torn line the index would cut off"])
async def test_hard_link_to_an_outside_file_is_never_written(
    file_store: FileTokenStore, capture_dir: Path, outside: Path, content: bytes
) -> None:
    """A jsonl that is also linked elsewhere is never appended to nor truncated."""
    outside.write_bytes(content)
    before = _snapshot(outside)
    os.link(outside, capture_dir / "r1.tokens.jsonl")
    with pytest.raises(CaptureCorrupt, match="hard links"):
        await file_store.put(make_entry("r1", "c1", [1], [2]))
    assert _snapshot(outside) == before


# -- item 5: planted FIFOs ---------------------------------------------------------------


@contextlib.contextmanager
def _fifo(path: Path) -> Iterator[None]:
    """A FIFO at `path`; afterwards, a reader the code under test left blocked is released."""
    os.mkfifo(path)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # wakes a blocked open


@pytest.mark.parametrize("kind", KINDS)
async def test_fifo_masks_the_finalize_promptly(
    file_store: FileTokenStore, capture_dir: Path, tmp_path: Path, kind: str
) -> None:
    """A FIFO under a capture file's name never blocks: finalize masks within seconds."""
    with _fifo(capture_dir / _name("r1", kind)):
        started = time.monotonic()
        with anyio.fail_after(10):
            build = await _finalize(file_store, "r1")
            with pytest.raises(CaptureCorrupt, match="FIFO"):
                await file_store.put(make_entry("r1", "c1", [1], [2]))
        assert time.monotonic() - started < 5
    _assert_masked_naming(build, _name("r1", kind), tmp_path)
    assert "FIFO" in build["error"]


# -- item 6: stray names and untrusted captures in a sweep -------------------------------


def _age(directory: Path, pattern: str, seconds: float) -> None:
    then = time.time() - seconds
    for path in directory.glob(pattern):
        os.utime(path, (then, then), follow_symlinks=False)


async def _retire(store: FileTokenStore, rollout_id: str) -> None:
    await store.put(make_entry(rollout_id, "c1", [1], [2]))
    snapshot = await store.freeze(rollout_id)
    assert await store.drop(rollout_id, snapshot_id=snapshot.snapshot_id, version=snapshot.version)


async def test_sweep_skips_stray_names_and_sweeps_the_rest(
    file_store: FileTokenStore, capture_dir: Path, outside: Path
) -> None:
    """A stray name and a capture with a planted link are reported; old tombstones still go."""
    await _retire(file_store, "a-retired")
    await _retire(file_store, "z-retired")
    stray = capture_dir / "notes about run 7.tokens.jsonl"
    stray.write_bytes(b"hand-written notes\n")
    await _retire(file_store, "planted")
    (capture_dir / "planted.tokens.jsonl").symlink_to(outside)
    _age(capture_dir, "*", 10 * HOUR)
    before = _snapshot(outside)

    report = await sweep(file_store, retired_older_than=HOUR)

    assert [(c.rollout_id, c.reason) for c in report.captures] == [
        ("a-retired", "retired"),
        ("z-retired", "retired"),
    ]
    skipped = {s.name: s.reason for s in report.skipped}
    assert set(skipped) == {"notes about run 7.tokens.jsonl", "planted"}
    assert "not a capture file of this store" in skipped["notes about run 7.tokens.jsonl"]
    assert "planted.tokens.jsonl is a symbolic link" in skipped["planted"]
    assert stray.read_bytes() == b"hand-written notes\n"
    assert _snapshot(outside) == before
    assert await file_store.admin.rollout_ids() == ["planted"]  # stray names are no rollouts


async def test_sweep_reports_a_stray_state_name_and_sweeps_the_rest(
    file_store: FileTokenStore, capture_dir: Path
) -> None:
    """A stray name does not stop a sweep: it is reported as skipped, the rest is swept."""
    await _retire(file_store, "r1")
    (capture_dir / "notes about run 7.tokens.state.json").write_bytes(b"{}")
    report = await sweep(file_store, retired_older_than=0, now=time.time() + HOUR)
    assert [s.rollout_id for s in report.captures] == ["r1"]
    assert [s.name for s in report.skipped] == ["notes about run 7.tokens.state.json"]


# -- item 11: temp files of killed state writes ------------------------------------------


def _temp(directory: Path, rollout_id: str, age: float) -> Path:
    path = directory / f".{rollout_id}.tokens.state.json.{os.urandom(16).hex()}.tmp"
    path.write_bytes(b'{"frozen": fal')
    then = time.time() - age
    os.utime(path, (then, then))
    return path


async def test_sweep_removes_stale_temp_files_only(
    file_store: FileTokenStore, capture_dir: Path
) -> None:
    """Temp files older than a minute go (with or without their capture); fresh ones stay."""
    await file_store.put(make_entry("r1", "c1", [1], [2]))
    stale = _temp(capture_dir, "r1", 120)
    lonely = _temp(capture_dir, "gone", 3 * HOUR)
    fresh = _temp(capture_dir, "r1", 1)
    dry = await sweep(file_store, retired_older_than=HOUR, dry_run=True)
    assert sorted(f.name for f in dry.leftovers) == sorted([stale.name, lonely.name])
    assert stale.exists() and lonely.exists()

    report = await sweep(file_store, retired_older_than=HOUR)

    assert {(f.name, f.reason) for f in report.leftovers} == {
        (stale.name, "temp"),
        (lonely.name, "temp"),
    }
    assert report.captures == () and report.skipped == ()
    assert sorted(p.name for p in capture_dir.iterdir()) == sorted(
        [fresh.name, "r1.tokens.jsonl", "r1.tokens.lock", "r1.tokens.state.json"]
    )
    assert (await file_store.freeze("r1")).entries[0].model_call_id == "c1"


async def test_killed_state_write_leaves_a_temp_file_that_sweep_removes(
    file_store: FileTokenStore, capture_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer killed between writing the temp file and renaming it: the leftover is swept."""
    await file_store.put(make_entry("r1", "c1", [1], [2]))

    class Killed(BaseException):
        pass

    def killed(*args: object) -> None:
        raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", killed)
        with pytest.raises(Killed):
            await file_store.freeze("r1")
        # What a SIGKILL leaves: the `finally` that would unlink the temp never runs.
        patch.setattr(Path, "unlink", lambda self, missing_ok=False: None)
        with pytest.raises(Killed):
            await file_store.put(make_entry("r1", "c2", [1, 2, 3], [4]))
    temps = list(capture_dir.glob(".*.tmp"))
    assert len(temps) == 1
    _age(capture_dir, ".*.tmp", 120)
    report = await sweep(file_store, retired_older_than=HOUR)
    assert [f.name for f in report.leftovers] == [temps[0].name]
    assert not list(capture_dir.glob(".*.tmp"))


# -- retire order: the tombstone before the deletes --------------------------------------


async def _drop_crashing_after_the_tombstone(
    store: FileTokenStore, monkeypatch: pytest.MonkeyPatch, ref: dict[str, Any]
) -> None:
    """Drop r1 with a crash (a BaseException) where its data files would be deleted."""

    class Crash(BaseException):
        pass

    def crash(files: object) -> list[str]:
        raise Crash

    with monkeypatch.context() as patch:
        patch.setattr(CaptureFiles, "remove_data_files", crash)
        with pytest.raises(Crash):
            await store.drop("r1", **ref)


async def test_crash_between_tombstone_and_deletes_is_recovered(
    file_store: FileTokenStore, capture_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tombstone is written first; orphans left by a crash go with the next drop."""
    await file_store.put(make_entry("r1", "c1", [1], [2]))
    await file_store.begin_call("r1", "c1")
    snapshot = await file_store.freeze("r1")
    ref = {"snapshot_id": snapshot.snapshot_id, "version": snapshot.version}
    await _drop_crashing_after_the_tombstone(file_store, monkeypatch, ref)

    assert stored_state(file_store, "r1").retired is True
    assert (capture_dir / "r1.tokens.jsonl").exists()  # an orphan, behind its tombstone
    with pytest.raises(CaptureRetired):
        await file_store.put(make_entry("r1", "c2", [1, 2, 3], [4]))
    with pytest.raises(CaptureRetired):
        await file_store.freeze("r1")
    assert await file_store.drop("r1", **ref) is True  # a repeated drop: True, and cleans up
    assert sorted(p.name for p in capture_dir.iterdir()) == [
        "r1.tokens.lock",
        "r1.tokens.state.json",
    ]


async def test_sweep_removes_orphans_of_a_fresh_tombstone(
    file_store: FileTokenStore, capture_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Orphan data files behind a tombstone go at the next sweep; the young tombstone stays."""
    await file_store.put(make_entry("r1", "c1", [1], [2]))
    snapshot = await file_store.freeze("r1")
    ref = {"snapshot_id": snapshot.snapshot_id, "version": snapshot.version}
    await _drop_crashing_after_the_tombstone(file_store, monkeypatch, ref)

    report = await sweep(file_store, retired_older_than=HOUR)
    assert [(f.name, f.reason) for f in report.leftovers] == [("r1.tokens.jsonl", "orphan")]
    assert report.captures == ()
    assert stored_state(file_store, "r1").retired is True
    assert not (capture_dir / "r1.tokens.jsonl").exists()


# -- frozen-empty captures ---------------------------------------------------------------


async def test_sweep_removes_frozen_empty_captures_only_when_asked(
    file_store: FileTokenStore, capture_dir: Path
) -> None:
    """Finalizing a never-captured id leaves a frozen empty capture: swept by empty_older_than.

    A frozen capture with anything in it (an entry, a failed or announced call,
    an incomplete mark) stays: that is evidence.
    """
    build = await _finalize(file_store, "ghost")
    assert build["mask_sample"] is True and build["mask_reason"] == "empty_capture"
    await file_store.put(make_entry("full", "c1", [1], [2]))
    await file_store.mark_incomplete("failed", "c1")
    await file_store.mark_incomplete("marked")
    await file_store.begin_call("announced", "c1")
    for rollout_id in ("full", "failed", "marked", "announced"):
        await file_store.freeze(rollout_id)
    later = time.time() + 10 * HOUR

    assert (
        await swept_captures(
            file_store, retired_older_than=HOUR, abandoned_older_than=HOUR, now=later
        )
        == []
    )
    swept = await swept_captures(
        file_store, retired_older_than=HOUR, empty_older_than=HOUR, now=later
    )

    assert [(s.rollout_id, s.reason) for s in swept] == [("ghost", "empty")]
    assert await file_store.admin.rollout_ids() == ["announced", "failed", "full", "marked"]
    assert not list(capture_dir.glob("ghost.*"))


async def test_fresh_frozen_empty_capture_stays(file_store: FileTokenStore) -> None:
    """An empty capture younger than the threshold is kept."""
    await file_store.freeze("ghost")
    assert await swept_captures(file_store, retired_older_than=HOUR, empty_older_than=HOUR) == []
    assert await file_store.admin.rollout_ids() == ["ghost"]


# -- inspect and delete (the store's side) -----------------------------------------------


async def test_inspect_reports_what_an_operator_needs(
    file_store: FileTokenStore, capture_dir: Path
) -> None:
    """State, entry count, incomplete reasons and ids, snapshot id and version; no change."""
    await file_store.put(make_entry("r1", "c1", [1], [2]))
    await file_store.begin_call("r1", "c1")
    await file_store.begin_call("r1", "c2")
    await file_store.mark_incomplete("r1", "c3")
    snapshot = await file_store.freeze("r1")
    before = {p.name: p.read_bytes() for p in capture_dir.iterdir()}
    inspected = await file_store.admin.inspect("r1")
    assert inspected is not None
    report = inspected.to_dict()
    assert {k: report[k] for k in ("state", "entries", "snapshot_id", "version", "retired")} == {
        "state": "frozen",
        "entries": 1,
        "snapshot_id": snapshot.snapshot_id,
        "version": snapshot.version,
        "retired": False,
    }
    assert (report["incomplete"], report["incomplete_call_ids"], report["missing_call_ids"]) == (
        True,
        ["c3"],
        ["c2"],
    )
    assert len(report["incomplete_reasons"]) == 3
    assert {p.name: p.read_bytes() for p in capture_dir.iterdir()} == before
    assert await file_store.admin.inspect("ghost") is None


async def test_delete_removes_planted_links_not_their_targets(
    file_store: FileTokenStore, capture_dir: Path, outside: Path
) -> None:
    """The admin delete of a capture with planted links removes the names only."""
    await file_store.put(make_entry("r1", "c1", [1], [2]))
    (capture_dir / "r1.tokens.intents").symlink_to(outside)
    (capture_dir / "r1.tokens.lock").unlink()
    (capture_dir / "r1.tokens.lock").symlink_to(outside)
    before = _snapshot(outside)
    removed = await file_store.admin.delete("r1")
    assert "r1.tokens.intents" in removed and "r1.tokens.jsonl" in removed
    assert list(capture_dir.iterdir()) == []
    assert _snapshot(outside) == before


async def test_errors_name_no_outside_path(
    file_store: FileTokenStore, capture_dir: Path, outside: Path
) -> None:
    """The refusal names the capture file, never the link's target."""
    (capture_dir / "r1.tokens.state.json").symlink_to(outside)
    with pytest.raises(CaptureCorrupt) as refused:
        await file_store.freeze("r1")
    assert "r1.tokens.state.json" in str(refused.value)
    assert str(outside) not in str(refused.value) and "precious" not in str(refused.value)
