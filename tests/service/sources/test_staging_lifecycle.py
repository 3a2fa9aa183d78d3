"""A staging rollout's life in every local store: freeze, the fence, drop, the family guard, admin.

`store` is a memory, a file and a redis store in turn (docs/staging.md#storage).
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest

from tests.support.captures import make_entry
from tests.support.staging_stores import Conversation
from tests.support.stores import swept_captures
from token_finalizer.core.errors import CaptureConflict, CaptureFrozen, CaptureRetired
from token_finalizer.sources.base import ParsedStagedCall

pytestmark = pytest.mark.anyio

RID = "rollout-life"


@pytest.fixture
def chat() -> Conversation:
    """Three calls of rollout-life; c3's row is committed, the others' too."""
    return Conversation.of(RID, 3)


async def _write(store: Any, chat: Conversation, *, orphan: bool = False) -> None:
    """Stage and commit every call; with `orphan`, c3 is staged but never committed."""
    for record, row in zip(chat.records, chat.rows, strict=True):
        await store.stage(record)
        if not (orphan and record.model_call_id == "c3"):
            await store.record_ledger_row(RID, row)


async def _retired(store: Any, chat: Conversation, *, orphan: bool = False) -> Any:
    await _write(store, chat, orphan=orphan)
    snapshot = await store.freeze(RID)
    assert await store.drop(RID, snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    return snapshot


# -- freeze ---------------------------------------------------------------------------------


async def test_freeze_answers_the_manifest_and_snapshots_in_manifest_order(
    store: Any, chat: Conversation
) -> None:
    """The snapshot has no entries; `staged` pairs each manifest record with its staged call."""
    await _write(store, chat)
    snapshot = await store.freeze(RID)
    staged = snapshot.staged
    assert (snapshot.entries, snapshot.incomplete) == ((), False)
    assert [r.model_call_id for r in staged.manifest.records] == ["c1", "c2", "c3"]
    assert list(staged.snapshots) == [record.base_snapshot() for record in chat.records]


async def test_a_committed_call_that_was_never_staged_freezes_as_none(
    store: Any, chat: Conversation
) -> None:
    """A manifest record without its staged call has None in its place."""
    await store.stage(chat.records[0])
    await store.record_ledger_row(RID, chat.rows[0])
    await store.record_ledger_row(RID, chat.rows[1])
    staged = (await store.freeze(RID)).staged
    assert (staged.snapshots[1], staged.missing_call_ids) == (None, ("c2",))


async def test_the_version_counts_every_row_and_staged_call(store: Any, chat: Conversation) -> None:
    """Three staged calls and three rows, then the freeze: version 7; a replay adds nothing."""
    await _write(store, chat)
    await store.record_ledger_row(RID, chat.rows[0])
    assert (await store.freeze(RID)).version == 7


async def test_a_second_freeze_is_the_same_snapshot(store: Any, chat: Conversation) -> None:
    """Freezing again answers the same snapshot id, version and manifest."""
    await _write(store, chat)
    first, second = await store.freeze(RID), await store.freeze(RID)
    assert (first.snapshot_id, first.version, first.staged) == (
        second.snapshot_id,
        second.version,
        second.staged,
    )


async def test_freeze_lines_hands_back_the_stored_snapshot_json(
    store: Any, chat: Conversation
) -> None:
    """The store server's path gets each record's base snapshot: its JSON, or the parsed call."""
    await _write(store, chat)
    frozen = await store.freeze_lines(RID)
    assert frozen.lines == ()
    parsed = [
        line.base() if isinstance(line, ParsedStagedCall) else orjson.loads(line)
        for line in frozen.staged.snapshots
    ]
    assert [snapshot["model_call_id"] for snapshot in parsed] == [
        "c1",
        "c2",
        "c3",
    ]


# -- the fence ----------------------------------------------------------------------------


async def test_a_row_after_the_freeze_is_refused(store: Any, chat: Conversation) -> None:
    """record after freeze: CaptureFrozen."""
    await store.record_ledger_row(RID, chat.rows[0])
    await store.freeze(RID)
    with pytest.raises(CaptureFrozen):
        await store.record_ledger_row(RID, chat.rows[1])


async def test_a_failure_after_the_freeze_is_refused(store: Any, chat: Conversation) -> None:
    """record_failure after freeze: CaptureFrozen, and the manifest stays as frozen."""
    await store.record_ledger_row(RID, chat.rows[0])
    await store.freeze(RID)
    with pytest.raises(CaptureFrozen):
        await store.record_ledger_failure(RID, "c2", "unresolved_parent")
    assert (await store.ledger_manifest(RID)).failures == ()


async def test_a_stage_after_the_freeze_is_refused(store: Any, chat: Conversation) -> None:
    """stage after freeze: CaptureFrozen."""
    await store.stage(chat.records[0])
    await store.freeze(RID)
    with pytest.raises(CaptureFrozen):
        await store.stage(chat.records[1])


# -- drop -----------------------------------------------------------------------------------


async def test_drop_removes_every_staged_call_orphans_included(
    store: Any, chat: Conversation
) -> None:
    """After retire, no staged call of the rollout is left, committed or orphaned."""
    await _retired(store, chat, orphan=True)
    assert await store.fetch_staged(RID, ["c1", "c2", "c3"]) == (None, None, None)


async def test_drop_removes_the_ledger(store: Any, chat: Conversation) -> None:
    """After retire: has_rows is False, the manifest empty, nothing resolves over rows."""
    await _retired(store, chat)
    manifest = await store.ledger_manifest(RID)
    assert (await store.ledger_has_rows(RID), manifest.records, manifest.failures) == (
        False,
        (),
        (),
    )


async def test_drop_keeps_a_retired_tombstone(store: Any, chat: Conversation) -> None:
    """The state stays, retired, with the dropped version; writes are refused."""
    snapshot = await _retired(store, chat)
    state = await store.admin.status(RID)
    assert (state.retired, state.version) == (True, snapshot.version)
    with pytest.raises(CaptureRetired):
        await store.stage(chat.records[0])


async def test_drop_of_another_version_keeps_everything(store: Any, chat: Conversation) -> None:
    """A drop naming another version answers False and deletes nothing."""
    await _write(store, chat)
    snapshot = await store.freeze(RID)
    dropped = await store.drop(RID, snapshot_id=snapshot.snapshot_id, version=snapshot.version + 1)
    assert (dropped, await store.ledger_has_rows(RID)) == (False, True)


# -- the family guard -----------------------------------------------------------------------


async def test_a_token_entry_for_a_staging_rollout_is_refused(
    store: Any, chat: Conversation
) -> None:
    """put on a rollout holding ledger rows: CaptureConflict naming the staging ledger."""
    await store.record_ledger_row(RID, chat.rows[0])
    with pytest.raises(CaptureConflict, match="holds a staging ledger"):
        await store.put(make_entry(RID, "e1", [1], [2]))


async def test_an_announcement_for_a_staging_rollout_is_refused(
    store: Any, chat: Conversation
) -> None:
    """begin_call on a rollout holding staged calls: CaptureConflict."""
    await store.stage(chat.records[0])
    with pytest.raises(CaptureConflict, match="holds a staging ledger"):
        await store.begin_call(RID, "e1")


async def test_an_incomplete_mark_for_a_staging_rollout_is_refused(
    store: Any, chat: Conversation
) -> None:
    """mark_incomplete on a staging rollout: CaptureConflict (its version stays)."""
    await store.stage(chat.records[0])
    with pytest.raises(CaptureConflict, match="holds a staging ledger"):
        await store.mark_incomplete(RID, "e1")


async def test_a_staged_call_for_a_token_rollout_is_refused(store: Any, chat: Conversation) -> None:
    """stage on a rollout holding entries: CaptureConflict naming the token entries."""
    await store.put(make_entry(RID, "e1", [1], [2]))
    with pytest.raises(CaptureConflict, match="holds token entries"):
        await store.stage(chat.records[0])


async def test_a_ledger_row_for_a_token_rollout_is_refused(store: Any, chat: Conversation) -> None:
    """A ledger row on a rollout with an announced call: CaptureConflict."""
    await store.begin_call(RID, "e1")
    with pytest.raises(CaptureConflict, match="holds token entries"):
        await store.record_ledger_failure(RID, "c1", "unresolved_parent")


# -- admin ----------------------------------------------------------------------------------


async def test_inspect_shows_rows_failures_staged_calls_and_orphans(
    store: Any, chat: Conversation
) -> None:
    """The report's `staging` names committed calls, failures, the staged count and orphans."""
    await _write(store, chat, orphan=True)
    await store.record_ledger_failure(RID, "c3", "invalid_worker_commit_coordinates")
    report = (await store.admin.inspect(RID)).to_dict()
    assert report["staging"] == {
        "ledger_rows": 3,
        "committed_calls": ["c1", "c2"],
        "failures": [{"model_call_id": "c3", "reason": "invalid_worker_commit_coordinates"}],
        "staged_calls": 3,
        "orphans": ["c3"],
        "cleared_calls": 0,
    }
    assert (report["state"], report["version"]) == ("open", 6)


async def test_a_token_rollout_has_no_staging_report(store: Any) -> None:
    """inspect of a token-capture rollout has no `staging` key."""
    await store.put(make_entry(RID, "e1", [1], [2]))
    assert "staging" not in (await store.admin.inspect(RID)).to_dict()


async def test_a_staging_rollout_is_listed(store: Any, chat: Conversation) -> None:
    """rollout_ids lists a rollout holding only a ledger row."""
    await store.record_ledger_failure(RID, "c1", "unresolved_parent")
    assert await store.admin.rollout_ids() == [RID]


async def test_sweep_removes_an_abandoned_staging_rollout(store: Any, chat: Conversation) -> None:
    """Never frozen and quiet for the abandoned age: removed whole, orphans with it."""
    await _write(store, chat, orphan=True)
    later = time.time() + 3600
    swept = await swept_captures(store, retired_older_than=1e9, abandoned_older_than=60, now=later)
    assert ([c.reason for c in swept], await store.fetch_staged(RID, ["c3"])) == (
        ["abandoned"],
        (None,),
    )


async def test_sweep_keeps_a_frozen_staging_rollout_as_evidence(
    store: Any, chat: Conversation
) -> None:
    """A frozen staging rollout that was not retired holds something: the empty rule spares it."""
    await _write(store, chat)
    await store.freeze(RID)
    later = time.time() + 3600
    swept = await swept_captures(store, retired_older_than=1e9, empty_older_than=60, now=later)
    assert (swept, await store.ledger_has_rows(RID)) == ([], True)


async def test_delete_removes_a_staging_rollout(store: Any, chat: Conversation) -> None:
    """store delete leaves nothing: no status, no staged call."""
    await _write(store, chat)
    await store.admin.delete(RID)
    assert (await store.admin.status(RID), await store.fetch_staged(RID, ["c1"])) == (
        None,
        (None,),
    )
