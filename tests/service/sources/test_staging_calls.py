"""Staged calls in every local store (docs/staging.md#storage): write-once, custody, fetch.

`store` is a memory, a file and a redis store in turn.
"""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from tests.support.staging_stores import Conversation
from token_finalizer.core.errors import CaptureConflict
from token_finalizer.core.staging import (
    CustodyRefusal,
    StagedCallRecord,
    StagingRecordError,
    hash_chain,
    hash_staged_call,
    hash_tokens,
)

pytestmark = pytest.mark.anyio

RID = "rollout-staged"
ATTACHMENTS = {"image": {"bytes": base64.b64encode(b"\x00\xffpng").decode()}, "meta": {"json": [1]}}


@pytest.fixture
def chat() -> Conversation:
    """A three-call chain c1 -> c2 -> c3, the first call with extras."""
    chat = Conversation(RID)
    chat.add("c1", extras={"routed_experts": [[[1, 2]]]})
    chat.add("c2")
    chat.add("c3")
    return chat


async def _stage_all(store: Any, chat: Conversation) -> None:
    for record in chat.records:
        await store.stage(record)


def _resealed(record: StagedCallRecord, **changes: Any) -> StagedCallRecord:
    """`record` with `changes`, its staging digest recomputed: a worker that staged it so."""
    fields = {**record.to_json(), **changes}
    extras = fields.pop("extras")
    del fields["digest"]
    return StagedCallRecord(digest=hash_staged_call(**fields), extras=extras, **fields)


# -- write-once ---------------------------------------------------------------------------


async def test_a_new_call_is_stored(store: Any, chat: Conversation) -> None:
    """stage answers True and the call comes back as its base snapshot (no extras)."""
    assert await store.stage(chat.records[0], ATTACHMENTS) is True
    (stored,) = await store.fetch_staged(RID, ["c1"])
    assert orjson.loads(stored) == {
        key: value for key, value in chat.records[0].to_json().items() if key != "extras"
    }


async def test_the_same_call_again_is_a_replay(store: Any, chat: Conversation) -> None:
    """The identical record and attachments again answer False."""
    await store.stage(chat.records[0], ATTACHMENTS)
    assert await store.stage(chat.records[0], dict(ATTACHMENTS)) is False


async def test_another_payload_under_the_same_call_conflicts(
    store: Any, chat: Conversation
) -> None:
    """Other attachments under a staged call id are a CaptureConflict naming the call."""
    await store.stage(chat.records[0], ATTACHMENTS)
    with pytest.raises(CaptureConflict, match="c1"):
        await store.stage(chat.records[0], None)


async def test_malformed_attachments_are_refused(store: Any, chat: Conversation) -> None:
    """An attachment that is not {"bytes": base64} or {"json": value} is a StagingRecordError."""
    with pytest.raises(StagingRecordError, match="image"):
        await store.stage(chat.records[0], {"image": {"bytes": "not base64!"}})


# -- custody ------------------------------------------------------------------------------


async def test_a_call_whose_parent_is_not_staged_is_refused(store: Any, chat: Conversation) -> None:
    """A token_in call on a parent the store does not hold: parent_not_staged."""
    with pytest.raises(CustodyRefusal) as refused:
        await store.stage(chat.records[1])
    assert refused.value.check == "parent_not_staged"


async def test_a_wrong_prefix_mid_chain_is_refused(store: Any, chat: Conversation) -> None:
    """A call generated on another prefix than its parent chain: cumulative_hash_mismatch."""
    await store.stage(chat.records[0])
    wrong = _resealed(chat.records[1], cumulative_hash=hash_tokens([5, 5, 5]))
    with pytest.raises(CustodyRefusal) as refused:
        await store.stage(wrong)
    assert refused.value.check == "cumulative_hash_mismatch"


async def test_a_forged_chain_link_is_refused(store: Any, chat: Conversation) -> None:
    """A call chained onto another hash than its staged parent's: chain_hash_mismatch."""
    await store.stage(chat.records[0])
    forged = _resealed(
        chat.records[1], chain_hash=hash_chain("f" * 64, chat.records[1].token_ids_delta)
    )
    with pytest.raises(CustodyRefusal) as refused:
        await store.stage(forged)
    assert refused.value.check == "chain_hash_mismatch"


async def test_a_child_starting_elsewhere_than_its_parent_ends_is_refused(
    store: Any, chat: Conversation
) -> None:
    """prev_len other than the parent's cum_len: parent_length_mismatch."""
    await store.stage(chat.records[0])
    child = chat.records[1]
    shifted = _resealed(child, prev_len=child.prev_len + 1, cum_len=child.cum_len + 1)
    with pytest.raises(CustodyRefusal) as refused:
        await store.stage(shifted)
    assert refused.value.check == "parent_length_mismatch"


async def test_a_refused_call_is_not_stored(store: Any, chat: Conversation) -> None:
    """After a custody refusal the call is not fetchable."""
    with pytest.raises(CustodyRefusal):
        await store.stage(chat.records[1])
    assert await store.fetch_staged(RID, ["c2"]) == (None,)


async def test_a_whole_chain_passes_custody(store: Any, chat: Conversation) -> None:
    """Calls staged root first, each on its staged parent, are all stored."""
    await _stage_all(store, chat)
    fetched = await store.fetch_staged(RID, ["c1", "c2", "c3"])
    assert [orjson.loads(line)["model_call_id"] for line in fetched] == ["c1", "c2", "c3"]


# -- fetch --------------------------------------------------------------------------------


async def test_fetch_keeps_the_order_asked_and_marks_missing_calls(
    store: Any, chat: Conversation
) -> None:
    """Snapshots come back in the order of the keys, None where nothing is staged."""
    await _stage_all(store, chat)
    fetched = await store.fetch_staged(RID, ["c3", "nope", "c1"])
    assert [None if line is None else orjson.loads(line)["model_call_id"] for line in fetched] == [
        "c3",
        None,
        "c1",
    ]


async def test_extras_come_back_per_call(store: Any, chat: Conversation) -> None:
    """fetch_extras maps each staged call to its extras (None when it staged none)."""
    await _stage_all(store, chat)
    assert await store.fetch_extras(RID, ["c1", "c2", "nope"]) == {
        "c1": {"routed_experts": [[[1, 2]]]},
        "c2": None,
    }


async def test_attachments_come_back_as_staged(store: Any, chat: Conversation) -> None:
    """Bytes stay base64 bytes, JSON values stay JSON; unknown calls have none (None)."""
    await store.stage(chat.records[0], ATTACHMENTS)
    assert await store.fetch_attachments(RID, "c1") == ATTACHMENTS
    assert await store.fetch_attachments(RID, "nope") is None


async def test_a_call_without_attachments_has_an_empty_set(store: Any, chat: Conversation) -> None:
    """A call staged with attachments=None answers {}."""
    await store.stage(chat.records[0])
    assert await store.fetch_attachments(RID, "c1") == {}


async def test_an_unknown_rollout_has_no_staged_calls(store: Any) -> None:
    """Fetches of a rollout nobody wrote find nothing."""
    assert (
        await store.fetch_staged("never-seen", ["c1"]),
        await store.fetch_extras("never-seen", ["c1"]),
    ) == ((None,), {})
