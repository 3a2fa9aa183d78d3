"""Clearing staged calls one by one in every local store (docs/staging.md#clearing-staged-calls).

`store` is a memory, a file and a redis store in turn. A clear deletes
exactly the named staged calls, is idempotent, keeps the ledger, and leaves
a tombstone so that write-once holds across it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.staging_stores import Conversation
from tests.support.stores import sweep
from token_finalizer import FileTokenStore
from token_finalizer.core.errors import CaptureConflict, CaptureFrozen
from token_finalizer.core.staging import CustodyRefusal

pytestmark = pytest.mark.anyio

RID = "rollout-clear"
_ATTACHMENT = {"pixels": {"bytes": "AAEC"}}


@pytest.fixture
def chat() -> Conversation:
    """Three calls c1 -> c2 -> c3 of rollout-clear, c3 with extras."""
    chat = Conversation.of(RID, 2)
    chat.add("c3", extras={"routed_experts": [[[1, 2]]]})
    return chat


async def _write(store: Any, chat: Conversation) -> None:
    """Stage (with an attachment) and commit every call."""
    for record, row in zip(chat.records, chat.rows, strict=True):
        await store.stage(record, _ATTACHMENT)
        await store.record_ledger_row(RID, row)


async def test_clear_deletes_exactly_the_named_calls(store: Any, chat: Conversation) -> None:
    """c1 and c3 go (the count says two were held); c2 is fetched as before."""
    await _write(store, chat)
    before = await store.fetch_staged(RID, ["c2"])
    assert await store.clear_staged(RID, ["c1", "c3"]) == 2
    fetched = await store.fetch_staged(RID, ["c1", "c2", "c3"])
    assert (fetched[0], fetched[1], fetched[2]) == (None, before[0], None)


async def test_clear_deletes_the_extras_and_attachments_too(store: Any, chat: Conversation) -> None:
    """A cleared call has no extras and no attachments left to read."""
    await _write(store, chat)
    await store.clear_staged(RID, ["c3"])
    assert await store.fetch_extras(RID, ["c3"]) == {}
    assert await store.fetch_attachments(RID, "c3") is None


async def test_clear_keeps_the_ledger(store: Any, chat: Conversation) -> None:
    """The manifest is the same after a clear: only staged calls are deleted."""
    await _write(store, chat)
    manifest = await store.ledger_manifest(RID)
    await store.clear_staged(RID, ["c1", "c2", "c3"])
    assert await store.ledger_manifest(RID) == manifest
    assert await store.ledger_has_rows(RID)


async def test_clear_deletes_a_dead_branch_and_an_orphan(store: Any, chat: Conversation) -> None:
    """A retried sibling (never on the terminal chain) and a call never committed are cleared."""
    await _write(store, chat)
    sibling = Conversation.of(RID, 1, prefix="c")  # c1's identical twin, restaged as "retry"
    retry = sibling.add("retry")  # a child of c1 that no ledger row names
    await store.stage(retry)
    assert await store.clear_staged(RID, ["retry"]) == 1
    assert await store.fetch_staged(RID, ["retry"]) == (None,)


async def test_clear_is_idempotent(store: Any, chat: Conversation) -> None:
    """A second clear of the same calls, and a call never staged, count nothing, raise nothing."""
    await _write(store, chat)
    await store.clear_staged(RID, ["c1"])
    assert await store.clear_staged(RID, ["c1", "never-staged"]) == 0
    assert await store.clear_staged(RID, []) == 0


async def test_inspect_counts_the_cleared_calls(store: Any, chat: Conversation) -> None:
    """`store inspect` shows two staged calls left and one cleared; the rows are all there."""
    await _write(store, chat)
    await store.clear_staged(RID, ["c2"])
    staging = (await store.admin.inspect(RID)).to_dict()["staging"]
    assert (staging["ledger_rows"], staging["staged_calls"], staging["cleared_calls"]) == (3, 2, 1)


async def test_clear_of_an_unknown_rollout_creates_nothing(store: Any) -> None:
    """A clear of a rollout the store never saw counts nothing and leaves no trace."""
    assert await store.clear_staged("rollout-unknown", ["c1"]) == 0
    assert await store.admin.rollout_ids() == []


async def test_a_cleared_call_cannot_be_staged_again(store: Any, chat: Conversation) -> None:
    """Write-once holds across a clear: the same record again is a conflict, not a replay."""
    await _write(store, chat)
    await store.clear_staged(RID, ["c3"])
    with pytest.raises(CaptureConflict, match="cleared"):
        await store.stage(chat.records[2], _ATTACHMENT)


async def test_a_cleared_call_on_a_cleared_parent_fails_custody_first(
    store: Any, chat: Conversation
) -> None:
    """As for any other payload, the custody checks come before the write-once refusal."""
    await _write(store, chat)
    await store.clear_staged(RID, ["c2", "c3"])
    with pytest.raises(CustodyRefusal) as refused:
        await store.stage(chat.records[2], _ATTACHMENT)
    assert refused.value.check == "parent_not_staged"


async def test_a_child_of_a_cleared_call_fails_custody(store: Any, chat: Conversation) -> None:
    """A call staged on a parent that was cleared is refused: its parent is no longer staged."""
    await _write(store, chat)
    await store.clear_staged(RID, ["c3"])
    child = chat.add("c4")
    with pytest.raises(CustodyRefusal) as refused:
        await store.stage(child)
    assert refused.value.check == "parent_not_staged"


async def test_clear_of_a_frozen_rollout_is_refused(store: Any, chat: Conversation) -> None:
    """A frozen rollout's staged calls belong to its snapshot: CaptureFrozen, nothing deleted."""
    await _write(store, chat)
    await store.freeze(RID)
    with pytest.raises(CaptureFrozen, match="retired"):
        await store.clear_staged(RID, ["c1"])
    assert (await store.freeze(RID)).staged.missing_call_ids == ()


async def test_clear_of_a_retired_rollout_counts_nothing(store: Any, chat: Conversation) -> None:
    """After retire nothing is staged: a clear is a no-op, not an error."""
    await _write(store, chat)
    snapshot = await store.freeze(RID)
    await store.drop(RID, snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    assert await store.clear_staged(RID, ["c1"]) == 0


async def test_a_freeze_after_a_clear_misses_the_cleared_calls(
    store: Any, chat: Conversation
) -> None:
    """The manifest still names c2; its staged call is None, so a finalize masks it."""
    await _write(store, chat)
    await store.clear_staged(RID, ["c2"])
    staged = (await store.freeze(RID)).staged
    assert staged.missing_call_ids == ("c2",)


async def test_clear_does_not_change_the_version(store: Any, chat: Conversation) -> None:
    """Three calls and three rows, a clear, then the freeze: version 7, as without the clear."""
    await _write(store, chat)
    await store.clear_staged(RID, ["c1"])
    assert (await store.freeze(RID)).version == 7


async def test_clear_refuses_an_invalid_call_id(store: Any, chat: Conversation) -> None:
    """A call id with a control character is a ValueError naming it; nothing is deleted."""
    await _write(store, chat)
    with pytest.raises(ValueError, match="bad"):
        await store.clear_staged(RID, ["c1", "bad\nid"])
    assert None not in await store.fetch_staged(RID, ["c1", "c2", "c3"])


# -- the file store ---------------------------------------------------------------------------


async def test_file_clear_removes_the_tokens_from_disk(tmp_path: Path, chat: Conversation) -> None:
    """The staged-call file keeps a tombstone in the cleared call's place, not its record."""
    store = FileTokenStore(tmp_path)
    await _write(store, chat)
    await store.clear_staged(RID, ["c3"])
    lines = (tmp_path / f"{RID}.staged.jsonl").read_bytes().splitlines()
    assert lines[2] == b'{"cleared":"c3"}'
    assert b"routed_experts" not in b"".join(lines)
    await store.close()


async def test_file_clear_is_seen_by_another_process(tmp_path: Path, chat: Conversation) -> None:
    """A second store on the directory, which read the file before, reads the clear."""
    first, second = FileTokenStore(tmp_path), FileTokenStore(tmp_path)
    await _write(first, chat)
    assert None not in await second.fetch_staged(RID, ["c1", "c2"])
    await first.clear_staged(RID, ["c1"])
    assert (await second.fetch_staged(RID, ["c1", "c2"]))[0] is None
    with pytest.raises(CaptureConflict, match="cleared"):
        await second.stage(chat.records[0], _ATTACHMENT)
    await first.close()
    await second.close()


async def test_a_clear_killed_before_its_rename_leaves_the_file_whole(
    tmp_path: Path, chat: Conversation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed mid-clear: every call is still staged; the sweep removes the temp file."""

    class Killed(BaseException):
        pass

    def killed(*args: object) -> None:
        raise Killed

    store = FileTokenStore(tmp_path)
    await _write(store, chat)
    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", killed)
        # What a SIGKILL leaves: the `finally` that would unlink the temp never runs.
        patch.setattr(Path, "unlink", lambda self, missing_ok=False: None)
        with pytest.raises(Killed):
            await store.clear_staged(RID, ["c1"])
    assert None not in await store.fetch_staged(RID, ["c1", "c2", "c3"])
    (temp,) = tmp_path.glob(".*.tmp")
    then = time.time() - 120
    os.utime(temp, (then, then))
    report = await sweep(store, retired_older_than=3600.0)
    assert [leftover.name for leftover in report.leftovers] == [temp.name]
    await store.close()
