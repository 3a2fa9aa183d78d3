"""The capture ledger in every local store (docs/staging.md#storage): write-once, reads, resolution.

`store` is a memory, a file and a redis store in turn, so the three hold
exactly the same rules.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.support.staging_stores import Conversation, query_of, resolution_of
from token_finalizer.core.errors import CaptureConflict, InvalidRolloutId
from token_finalizer.core.staging import StagingRecordError

pytestmark = pytest.mark.anyio

RID = "rollout-ledger"


@pytest.fixture
def chat() -> Conversation:
    """A three-call chain c1 -> c2 -> c3 of rollout-ledger."""
    return Conversation.of(RID, 3)


async def _record_all(store: Any, chat: Conversation) -> None:
    for row in chat.rows:
        await store.record_ledger_row(RID, row)


# -- write-once ---------------------------------------------------------------------------


async def test_a_new_row_is_appended(store: Any, chat: Conversation) -> None:
    """Recording a committed row answers True and the manifest lists it."""
    assert await store.record_ledger_row(RID, chat.rows[0]) is True
    manifest = await store.ledger_manifest(RID)
    assert [record.model_call_id for record in manifest.records] == ["c1"]


async def test_an_identical_row_again_is_a_replay(store: Any, chat: Conversation) -> None:
    """The same row twice answers False the second time and is stored once."""
    await store.record_ledger_row(RID, chat.rows[0])
    assert await store.record_ledger_row(RID, copy.deepcopy(chat.rows[0])) is False
    assert len((await store.ledger_manifest(RID)).records) == 1


async def test_another_admitted_at_conflicts(store: Any, chat: Conversation) -> None:
    """Any difference, admitted_at included, is a CaptureConflict naming the call."""
    await store.record_ledger_row(RID, chat.rows[0])
    changed = {**chat.rows[0], "admitted_at": chat.rows[0]["admitted_at"] + 1}
    with pytest.raises(CaptureConflict, match="c1"):
        await store.record_ledger_row(RID, changed)


async def test_a_row_after_a_failure_of_the_call_conflicts(store: Any, chat: Conversation) -> None:
    """A committed row for a call that already has a failure row is refused."""
    await store.record_ledger_failure(RID, "c1", "worker_capture_failed")
    with pytest.raises(CaptureConflict):
        await store.record_ledger_row(RID, chat.rows[0])


async def test_a_failure_after_the_row_is_appended(store: Any, chat: Conversation) -> None:
    """A failure of a committed call is a further row: the manifest lists both."""
    await store.record_ledger_row(RID, chat.rows[0])
    assert await store.record_ledger_failure(RID, "c1", "worker_capture_failed") is True
    manifest = await store.ledger_manifest(RID)
    assert ([r.model_call_id for r in manifest.records], manifest.failures[0].reason) == (
        ["c1"],
        "worker_capture_failed",
    )


async def test_the_same_failure_again_is_a_replay(store: Any) -> None:
    """One (call, reason) twice is one row; the second answers False."""
    await store.record_ledger_failure(RID, "c2", "worker_capture_failed")
    assert await store.record_ledger_failure(RID, "c2", "worker_capture_failed") is False
    assert len((await store.ledger_manifest(RID)).failures) == 1


async def test_a_new_reason_for_the_same_call_is_appended(store: Any) -> None:
    """Another reason for one call is a second failure row, in commit order."""
    await store.record_ledger_failure(RID, "c2", "worker_capture_failed")
    await store.record_ledger_failure(RID, "c2", "request_finished_without_staged_coordinates")
    reasons = [failure.reason for failure in (await store.ledger_manifest(RID)).failures]
    assert reasons == ["worker_capture_failed", "request_finished_without_staged_coordinates"]


async def test_records_and_failures_keep_commit_order(store: Any, chat: Conversation) -> None:
    """The manifest lists records and failures each in the order they were written."""
    await store.record_ledger_row(RID, chat.rows[0])
    await store.record_ledger_failure(RID, "x", "unresolved_parent")
    await store.record_ledger_row(RID, chat.rows[1])
    await store.record_ledger_failure(RID, "y", "worker_capture_failed")
    manifest = await store.ledger_manifest(RID)
    assert [r.model_call_id for r in manifest.records] == ["c1", "c2"]
    assert [f.model_call_id for f in manifest.failures] == ["x", "y"]


async def test_a_row_with_an_unknown_column_is_invalid(store: Any, chat: Conversation) -> None:
    """A row that is not exactly what commit_row makes raises StagingRecordError naming the key."""
    with pytest.raises(StagingRecordError, match="cumulative_token_ids"):
        await store.record_ledger_row(RID, {**chat.rows[0], "cumulative_token_ids": [1]})


async def test_a_row_whose_digest_is_not_its_cumulative_hash_is_invalid(
    store: Any, chat: Conversation
) -> None:
    """The row's digest must be the call's cumulative hash."""
    with pytest.raises(StagingRecordError, match="digest"):
        await store.record_ledger_row(RID, {**chat.rows[0], "digest": "0" * 64})


async def test_a_bad_rollout_id_is_refused(store: Any, chat: Conversation) -> None:
    """An id outside the store id rule raises InvalidRolloutId before anything is stored."""
    with pytest.raises(InvalidRolloutId):
        await store.record_ledger_row("bad id", chat.rows[0])


# -- reads --------------------------------------------------------------------------------


async def test_an_unknown_rollout_has_no_rows(store: Any) -> None:
    """has_rows is False and the manifest has empty lists."""
    manifest = await store.ledger_manifest("never-seen")
    assert (await store.ledger_has_rows("never-seen"), manifest.records, manifest.failures) == (
        False,
        (),
        (),
    )


async def test_a_failure_row_alone_counts_as_a_row(store: Any) -> None:
    """has_rows turns True with the first row of either kind."""
    await store.record_ledger_failure(RID, "c1", "unresolved_parent")
    assert await store.ledger_has_rows(RID) is True


# -- resolution ---------------------------------------------------------------------------


async def test_a_rollout_without_rows_does_not_resolve_over_the_ledger(store: Any) -> None:
    """resolve_ledger answers None: the store then resolves over token entries."""
    chat = Conversation.of(RID, 2)
    assert await store.resolve_ledger(RID, query_of(chat.requests[1])) is None


async def test_a_continuation_resolves_to_its_parent_row(store: Any, chat: Conversation) -> None:
    """The next call's items resolve to the last row, with its chain, chain hash and cum_len."""
    await _record_all(store, chat)
    answer = await resolution_of(store, RID, chat.request_items(3))
    assert answer["status"] == "resolved"
    assert answer["match"] == chat.staged_match(2)


async def test_a_middle_call_resolves_too(store: Any, chat: Conversation) -> None:
    """c2's request (which continues c1) resolves to c1 with every row present."""
    await _record_all(store, chat)
    answer = await resolution_of(store, RID, chat.requests[1])
    assert (answer["status"], answer["match"]["model_call_id"]) == ("resolved", "c1")


async def test_an_identical_retry_collapses_to_the_smallest_call_id(store: Any) -> None:
    """Two committed calls of one sequence resolve to the smaller id (not `ambiguous`)."""
    chat = Conversation.of(RID, 2)
    await _record_all(store, chat)
    retry = {**chat.rows[1], "model_call_id": "c2b", "response_id": "resp-c2b"}
    retry["staging_key"] = f"{RID}/c2b"
    await store.record_ledger_row(RID, retry)
    answer = await resolution_of(store, RID, chat.request_items(2))
    assert (answer["status"], answer["match"]["model_call_id"]) == ("resolved", "c2")


async def test_failure_rows_are_never_parents(store: Any, chat: Conversation) -> None:
    """A rollout with only failure rows resolves nothing: unresolved, no_match."""
    await store.record_ledger_failure(RID, "c1", "worker_capture_failed")
    answer = await resolution_of(store, RID, chat.requests[1])
    assert (answer["status"], answer["reason"]) == ("unresolved", "no_match")


async def test_another_context_does_not_resolve(store: Any, chat: Conversation) -> None:
    """Same assistant turns after another user turn: unresolved, no_match."""
    await _record_all(store, chat)
    items = chat.requests[1]
    changed = [{"role": "user", "content": "something else"}, *items[1:]]
    answer = await resolution_of(store, RID, changed)
    assert (answer["status"], answer["reason"]) == ("unresolved", "no_match")
