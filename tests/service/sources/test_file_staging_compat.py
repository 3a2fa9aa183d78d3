"""The file store's ledger is NeMo Gym 0.7.0's FileLineageStore file, byte for byte.

Gym's ledger writes `R.lineage.jsonl` (sorted-key compact JSON, one row a
line) under the flock of `R.tokens.lock`; the vectors hold the exact lines it
wrote. Our writes produce the same bytes (so Gym's reader parses them), and a
directory Gym wrote is finalizable by us. See docs/staging.md#storage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.staging_stores import Conversation, query_of, row_of_commit
from tests.support.staging_vectors import staging_case_ids, staging_cases
from token_finalizer import FileTokenStore
from token_finalizer.core.errors import CaptureConflict
from token_finalizer.sources._staging import ledger_line
from token_finalizer.sources.file import staging as staging_module

pytestmark = pytest.mark.anyio

WRITTEN = [case for case in staging_cases("ledger.json") if case["expected"]["file"]["lines"]]
RECORDED_ONLY = [
    case for case in WRITTEN if all(op["op"] != "append_raw_row" for op in case["inputs"]["ops"])
]


def _gym_file(directory: Path, rollout_id: str, lines: list[str]) -> None:
    (directory / f"{rollout_id}.lineage.jsonl").write_text("".join(f"{line}\n" for line in lines))


async def _write_ops(store: FileTokenStore, case: dict[str, Any]) -> None:
    for op in case["inputs"]["ops"]:
        try:
            if op["op"] == "record":
                commit = op["commit"]
                await store.record_ledger_row(commit["rollout_id"], row_of_commit(commit))
            elif op["op"] == "record_failure":
                await store.record_ledger_failure(
                    op["rollout_id"], op["model_call_id"], op["reason"]
                )
        except CaptureConflict:
            continue  # Gym's ledger refused it too (tests/service/sources/test_staging_vectors.py)


@pytest.mark.parametrize("case", RECORDED_ONLY, ids=staging_case_ids(RECORDED_ONLY))
async def test_our_ledger_file_is_gyms_byte_for_byte(tmp_path: Path, case: dict[str, Any]) -> None:
    """The rows we write are the lines Gym's FileLineageStore wrote for the same calls."""
    store = FileTokenStore(tmp_path)
    await _write_ops(store, case)
    for rollout_id, lines in case["expected"]["file"]["lines"].items():
        written = (tmp_path / f"{rollout_id}.lineage.jsonl").read_text()
        assert written == "".join(f"{line}\n" for line in lines)


def _last_manifest(case: dict[str, Any]) -> dict[str, Any]:
    ops, results = case["inputs"]["ops"], case["expected"]["file"]["results"]
    manifests = [
        res["result"] for op, res in zip(ops, results, strict=True) if op["op"] == "manifest"
    ]
    return manifests[-1]


@pytest.mark.parametrize(
    "case",
    [case for case in WRITTEN if any(op["op"] == "manifest" for op in case["inputs"]["ops"])],
    ids=lambda case: case["name"],
)
async def test_a_ledger_gym_wrote_gives_gyms_manifest(tmp_path: Path, case: dict[str, Any]) -> None:
    """A directory holding Gym's ledger file (legacy, broken rows too) reads as Gym reads it."""
    for rollout_id, lines in case["expected"]["file"]["lines"].items():
        _gym_file(tmp_path, rollout_id, lines)
    manifest = _last_manifest(case)
    found = await FileTokenStore(tmp_path).ledger_manifest(manifest["rollout_id"])
    assert found.to_json() == manifest


async def test_a_ledger_gym_wrote_freezes_and_retires(tmp_path: Path) -> None:
    """Gym's ledger file alone (no state file) freezes into its manifest and is dropped whole."""
    chat = Conversation.of("gym-rollout", 2)
    _gym_file(tmp_path, "gym-rollout", [ledger_line(row).decode() for row in chat.rows])
    store = FileTokenStore(tmp_path)
    snapshot = await store.freeze("gym-rollout")
    assert ([r.model_call_id for r in snapshot.staged.manifest.records], snapshot.version) == (
        ["c1", "c2"],
        3,
    )
    assert await store.drop("gym-rollout", snapshot_id=snapshot.snapshot_id, version=3)
    assert not (tmp_path / "gym-rollout.lineage.jsonl").exists()


async def test_a_torn_last_row_is_cut_and_never_read(tmp_path: Path) -> None:
    """A row without its newline (a writer died mid-line, never acknowledged) is cut off."""
    chat = Conversation.of("torn", 2)
    await FileTokenStore(tmp_path).record_ledger_row("torn", chat.rows[0])
    path = tmp_path / "torn.lineage.jsonl"
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"model_call_id":"c2","fail')
    store = FileTokenStore(tmp_path)
    assert len((await store.ledger_manifest("torn")).records) == 1
    assert path.read_bytes() == whole


async def test_a_process_reads_rows_another_one_appended(tmp_path: Path) -> None:
    """Two stores on one directory (two processes' views): each sees the other's rows at once."""
    chat = Conversation.of("shared", 2)
    first, second = FileTokenStore(tmp_path), FileTokenStore(tmp_path)
    await first.record_ledger_row("shared", chat.rows[0])
    assert await second.ledger_has_rows("shared") is True
    await second.record_ledger_row("shared", chat.rows[1])
    assert len((await first.ledger_manifest("shared")).records) == 2


async def test_a_ledger_deleted_and_written_again_is_read_anew(tmp_path: Path) -> None:
    """A process that read a ledger sees the new file after `store delete`, not the old rows."""
    chat = Conversation.of("again", 2)
    store = FileTokenStore(tmp_path)
    for row in chat.rows:
        await store.record_ledger_row("again", row)
    await FileTokenStore(tmp_path).admin.delete("again")
    await store.record_ledger_failure("again", "c9", "unresolved_parent")
    manifest = await store.ledger_manifest("again")
    assert (manifest.records, [f.model_call_id for f in manifest.failures]) == ((), ["c9"])


async def test_a_rollout_without_staging_resolves_no_ledger_on_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ledger or staged file: resolve_ledger answers None without a worker-thread hop."""

    def no_thread(*_: object, **__: object) -> None:
        raise AssertionError("a rollout without staging went to a worker thread")

    chat = Conversation.of("plain", 2)
    store = FileTokenStore(tmp_path)
    monkeypatch.setattr(staging_module.asyncio, "to_thread", no_thread)
    assert await store.resolve_ledger("plain", query_of(chat.requests[1])) is None


async def test_a_rollout_with_a_ledger_still_resolves_over_it(tmp_path: Path) -> None:
    """Once the ledger file exists the resolve reads it: the next call resolves to its row."""
    chat = Conversation.of("ledgered", 2)
    store = FileTokenStore(tmp_path)
    await store.record_ledger_row("ledgered", chat.rows[0])
    resolution = await store.resolve_ledger("ledgered", query_of(chat.requests[1]))
    assert resolution is not None and resolution.status == "resolved"
