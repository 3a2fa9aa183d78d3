"""The capture-store contract (docs/store-protocol.md), run against memory, file and redis stores.

Each test names one rule of the state machine; `store` is each kind in turn, so
the three stores are held to exactly the same behaviour. Admin operations
(status, rollout_ids, delete, sweep) run against the file and redis stores.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
import uuid
from typing import Any

import pytest

from tests.support.captures import make_entry
from tests.support.stores import swept_captures
from token_finalizer import (
    CaptureConflict,
    CaptureFrozen,
    CaptureRetired,
    InvalidRolloutId,
    TokenEntryError,
)
from token_finalizer.core.codec import dumps_entry_line

pytestmark = pytest.mark.anyio

# NeMo Gym's rule, which every write keeps (docs/records-and-builds.md#store-id-rule).
WRITERS_RULE = "must match ^[A-Za-z0-9][A-Za-z0-9._-]*$"
BAD_IDS = ["..", "../etc", "a/b", "a\\b", "%2e%2e", "a%2Fb", "a b", "a\x00b", "ｒ1", "é", "", "{x}"]
# Call ids are not keys: anything but control characters and lone surrogates (0.7's ids).
BAD_CALL_IDS = ["", "a\x00b", "a\nb", "a\rb", "c\x1b[2J", "c\x85", "\ud800", "x" * 201]
ENGINE_CALL_IDS = ["agent:3/call-7", "../etc", "{x}", "a b", "50%2F", "é-調用", "..", "a\u2028b"]


def _ids(snapshot: Any) -> list[str]:
    return [entry.model_call_id for entry in snapshot.entries]


async def _retired(store: Any, rollout_id: str = "r1") -> Any:
    """Put one call, freeze and drop: the rollout is a retired tombstone."""
    await store.put(make_entry(rollout_id, "c1", [1], [2]))
    snapshot = await store.freeze(rollout_id)
    assert await store.drop(rollout_id, snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    return snapshot


# -- put -------------------------------------------------------------------------------------


async def test_put_then_freeze_returns_the_entry(store: Any) -> None:
    """A stored call comes back in the snapshot with its tokens and log probs."""
    await store.put(make_entry("r1", "c1", [1, 2], [3, 4], log_probs=[-0.25, -0.5]))
    (entry,) = (await store.freeze("r1")).entries
    assert (entry.rollout_id, entry.model_call_id) == ("r1", "c1")
    assert entry.prompt_token_ids.tolist() == [1, 2]
    assert entry.generation_token_ids.tolist() == [3, 4]
    assert entry.generation_log_probs.tolist() == [-0.25, -0.5]


async def test_same_put_twice_is_a_no_op(store: Any) -> None:
    """Putting the same payload again stores one entry and bumps the version once."""
    entry = make_entry("r1", "c1", [1], [2])
    await store.put(entry)
    await store.put(entry)
    snapshot = await store.freeze("r1")
    assert _ids(snapshot) == ["c1"] and snapshot.version == 2


async def test_conflicting_put_fails(store: Any) -> None:
    """A different payload under a stored call id raises CaptureConflict naming the call."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    with pytest.raises(CaptureConflict, match="c1"):
        await store.put(make_entry("r1", "c1", [1], [3]))


async def test_conflicting_put_marks_the_rollout_incomplete(store: Any) -> None:
    """After a conflicting put the snapshot is incomplete."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    with pytest.raises(CaptureConflict):
        await store.put(make_entry("r1", "c1", [1], [3]))
    assert (await store.freeze("r1")).incomplete is True


async def test_conflicting_put_bumps_the_version(store: Any) -> None:
    """The incomplete mark of a conflict is a mutation: the version moves."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    with pytest.raises(CaptureConflict):
        await store.put(make_entry("r1", "c1", [1], [3]))
    assert (await store.freeze("r1")).version == 3


async def test_conflict_keeps_the_first_payload(store: Any) -> None:
    """The refused payload never replaces the stored one."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    with pytest.raises(CaptureConflict):
        await store.put(make_entry("r1", "c1", [1], [3]))
    (entry,) = (await store.freeze("r1")).entries
    assert entry.generation_token_ids.tolist() == [2]


async def test_each_new_put_bumps_the_version(store: Any) -> None:
    """Three new calls and the freeze make version 4."""
    for i in range(3):
        await store.put(make_entry("r1", f"c{i}", [1, i], [2]))
    assert (await store.freeze("r1")).version == 4


async def test_entries_keep_put_order(store: Any) -> None:
    """The snapshot lists the calls in the order they were stored."""
    for call_id in ("c9", "c1", "c5", "c0"):
        await store.put(make_entry("r1", call_id, [1], [2]))
    assert _ids(await store.freeze("r1")) == ["c9", "c1", "c5", "c0"]


async def test_unknown_fields_survive(store: Any) -> None:
    """Fields the reader does not know are stored and handed back unchanged."""
    await store.put(make_entry("r1", "c1", [1], [2], vendor_note={"k": [1, "x"]}))
    (entry,) = (await store.freeze("r1")).entries
    assert entry.extra["vendor_note"] == {"k": [1, "x"]}


async def test_non_finite_log_probs_survive(store: Any) -> None:
    """A -inf log probability is stored and read back as -inf."""
    await store.put(make_entry("r1", "c1", [1], [2, 3], log_probs=[-math.inf, -0.5]))
    (entry,) = (await store.freeze("r1")).entries
    assert entry.generation_log_probs.tolist() == [-math.inf, -0.5]


async def test_invalid_entry_is_refused(store: Any) -> None:
    """An entry failing validation raises TokenEntryError and stores nothing."""
    entry = make_entry("r1", "c1", [1], [2, 3], log_probs=[-0.5])
    with pytest.raises(TokenEntryError, match="generation_log_probs"):
        await store.put(entry)
    assert (await store.freeze("r1")).entries == ()


async def test_put_after_freeze_fails(store: Any) -> None:
    """No new call may be stored after the freeze."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    await store.freeze("r1")
    with pytest.raises(CaptureFrozen):
        await store.put(make_entry("r1", "c2", [1, 2, 3], [4]))


async def test_same_put_after_freeze_fails(store: Any) -> None:
    """Even a repeat of a stored payload is refused once frozen."""
    entry = make_entry("r1", "c1", [1], [2])
    await store.put(entry)
    await store.freeze("r1")
    with pytest.raises(CaptureFrozen):
        await store.put(entry)


async def test_conflicting_put_after_freeze_changes_nothing(store: Any) -> None:
    """After the freeze a conflicting put is CaptureFrozen and marks nothing."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    first = await store.freeze("r1")
    with pytest.raises(CaptureFrozen):
        await store.put(make_entry("r1", "c1", [1], [3]))
    again = await store.freeze("r1")
    assert (again.version, again.incomplete) == (first.version, False)


async def test_put_after_retire_fails(store: Any) -> None:
    """The tombstone makes a late put of that attempt fail."""
    await _retired(store)
    with pytest.raises(CaptureRetired):
        await store.put(make_entry("r1", "c2", [1, 2, 3], [4]))


# -- begin_call ---------------------------------------------------------------------------------


async def test_begin_call_does_not_bump_the_version(store: Any) -> None:
    """An announcement is not a mutation of the capture's version."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    await store.begin_call("r1", "c2")
    assert (await store.freeze("r1")).version == 2


async def test_announced_call_without_entry_makes_snapshot_incomplete(store: Any) -> None:
    """A call announced and never stored makes the snapshot incomplete."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    await store.begin_call("r1", "c2")
    assert (await store.freeze("r1")).incomplete is True


async def test_announced_call_that_arrived_keeps_snapshot_complete(store: Any) -> None:
    """An announced call whose entry arrived leaves the snapshot complete."""
    await store.begin_call("r1", "c1")
    await store.put(make_entry("r1", "c1", [1], [2]))
    assert (await store.freeze("r1")).incomplete is False


async def test_begin_call_after_freeze_fails(store: Any) -> None:
    """A call cannot be announced after the freeze."""
    await store.freeze("r1")
    with pytest.raises(CaptureFrozen):
        await store.begin_call("r1", "c9")


async def test_begin_call_after_retire_fails(store: Any) -> None:
    """A call cannot be announced for a retired rollout."""
    await _retired(store)
    with pytest.raises(CaptureRetired):
        await store.begin_call("r1", "c9")


# -- mark_incomplete -----------------------------------------------------------------------------


async def test_mark_incomplete_makes_snapshot_incomplete(store: Any) -> None:
    """A call marked failed makes the snapshot incomplete."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    await store.mark_incomplete("r1", "c2")
    assert (await store.freeze("r1")).incomplete is True


async def test_mark_incomplete_without_call_id_marks_the_rollout(store: Any) -> None:
    """An empty call id marks the rollout as a whole."""
    await store.mark_incomplete("r1")
    assert (await store.freeze("r1")).incomplete is True


async def test_mark_incomplete_bumps_the_version(store: Any) -> None:
    """An incomplete mark is a mutation: put (1), mark (2), freeze (3)."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    await store.mark_incomplete("r1", "c2")
    assert (await store.freeze("r1")).version == 3


async def test_mark_incomplete_after_freeze_bumps_the_version(store: Any) -> None:
    """A late mark is allowed and moves the version past the frozen snapshot's."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    first = await store.freeze("r1")
    await store.mark_incomplete("r1", "c2")
    again = await store.freeze("r1")
    assert again.version == first.version + 1


async def test_freeze_after_late_mark_is_incomplete_with_the_same_id(store: Any) -> None:
    """After a late mark the same snapshot id comes back, now incomplete."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    first = await store.freeze("r1")
    await store.mark_incomplete("r1", "c2")
    again = await store.freeze("r1")
    assert (again.snapshot_id, again.incomplete, _ids(again)) == (first.snapshot_id, True, ["c1"])


async def test_mark_incomplete_after_retire_fails(store: Any) -> None:
    """A retired rollout takes no incomplete mark."""
    await _retired(store)
    with pytest.raises(CaptureRetired):
        await store.mark_incomplete("r1", "c2")


# -- freeze ----------------------------------------------------------------------------------------


async def test_freeze_is_idempotent(store: Any) -> None:
    """Freezing twice returns the same snapshot identity and entries."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    first, second = await store.freeze("r1"), await store.freeze("r1")
    assert (first.snapshot_id, first.version) == (second.snapshot_id, second.version)
    assert _ids(second) == ["c1"]


async def test_first_freeze_bumps_the_version_once(store: Any) -> None:
    """One put then any number of freezes: version 2."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    for _ in range(3):
        snapshot = await store.freeze("r1")
    assert snapshot.version == 2


async def test_snapshot_id_is_a_uuid4_hex(store: Any) -> None:
    """The snapshot id is minted as uuid4().hex."""
    snapshot_id = (await store.freeze("r1")).snapshot_id
    assert uuid.UUID(hex=snapshot_id).version == 4 and snapshot_id == uuid.UUID(snapshot_id).hex


async def test_freeze_of_unknown_rollout_is_empty(store: Any) -> None:
    """A rollout that was never written freezes to an empty, complete snapshot."""
    snapshot = await store.freeze("ghost")
    assert snapshot.entries == () and snapshot.incomplete is False and snapshot.snapshot_id


async def test_freeze_after_retire_fails(store: Any) -> None:
    """A retired rollout cannot be frozen again."""
    await _retired(store)
    with pytest.raises(CaptureRetired):
        await store.freeze("r1")


async def test_rollouts_are_independent(store: Any) -> None:
    """Freezing one rollout leaves another open for writes."""
    await store.freeze("r1")
    await store.put(make_entry("r2", "c1", [1], [2]))
    assert _ids(await store.freeze("r2")) == ["c1"]


# -- drop ------------------------------------------------------------------------------------------


async def test_drop_of_matching_snapshot_retires(store: Any) -> None:
    """A drop naming the frozen snapshot answers True."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    snapshot = await store.freeze("r1")
    assert await store.drop("r1", snapshot_id=snapshot.snapshot_id, version=snapshot.version)


async def test_repeated_drop_returns_true(store: Any) -> None:
    """Repeating a successful drop returns True again and changes nothing."""
    snapshot = await _retired(store)
    state = await store.admin.status("r1")
    assert await store.drop("r1", snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    assert await store.admin.status("r1") == state


async def test_drop_with_stale_version_is_false(store: Any) -> None:
    """A drop naming another version keeps the capture."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    snapshot = await store.freeze("r1")
    ref = {"snapshot_id": snapshot.snapshot_id, "version": snapshot.version - 1}
    assert not await store.drop("r1", **ref)
    assert _ids(await store.freeze("r1")) == ["c1"]


async def test_drop_with_other_snapshot_id_is_false(store: Any) -> None:
    """A drop naming another snapshot id keeps the capture."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    snapshot = await store.freeze("r1")
    assert not await store.drop("r1", snapshot_id=uuid.uuid4().hex, version=snapshot.version)
    assert _ids(await store.freeze("r1")) == ["c1"]


async def test_drop_before_freeze_is_false(store: Any) -> None:
    """An open rollout cannot be dropped, and stays writable."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    assert not await store.drop("r1", snapshot_id=uuid.uuid4().hex, version=1)
    await store.put(make_entry("r1", "c2", [1, 2, 3], [4]))


async def test_drop_of_unknown_rollout_is_false(store: Any) -> None:
    """Nothing stored: nothing matches, and nothing is created."""
    assert not await store.drop("ghost", snapshot_id="x", version=1)
    assert await store.admin.status("ghost") is None


async def test_drop_after_later_incomplete_mark_is_false(store: Any) -> None:
    """A call marked failed after the freeze changes the version: the old snapshot cannot retire."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    snapshot = await store.freeze("r1")
    await store.mark_incomplete("r1", "c2")
    assert not await store.drop("r1", snapshot_id=snapshot.snapshot_id, version=snapshot.version)
    assert _ids(await store.freeze("r1")) == ["c1"]


async def test_drop_of_the_snapshot_after_a_late_mark_succeeds(store: Any) -> None:
    """The snapshot re-read after a late mark is the one that can retire."""
    await store.put(make_entry("r1", "c1", [1], [2]))
    await store.freeze("r1")
    await store.mark_incomplete("r1", "c2")
    again = await store.freeze("r1")
    assert await store.drop("r1", snapshot_id=again.snapshot_id, version=again.version)


# -- ids -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", BAD_IDS)
async def test_bad_rollout_ids_are_refused(store: Any, bad: str) -> None:
    """Rollout ids outside [A-Za-z0-9._-]+ are refused by every operation."""
    attempts = (
        lambda: store.freeze(bad),
        lambda: store.drop(bad, snapshot_id="x", version=1),
        lambda: store.mark_incomplete(bad),
        lambda: store.begin_call(bad, "c1"),
    )
    for attempt in attempts:
        with pytest.raises(InvalidRolloutId):
            await attempt()
    with pytest.raises(TokenEntryError):
        await store.put(make_entry("r1", "c1", [1], [2]) | {"rollout_id": bad})


@pytest.mark.parametrize("bad", ["_x1", "-x1", ".x1"])
async def test_writes_under_an_id_finalize_refuses_are_refused(store: Any, bad: str) -> None:
    """put, begin_call, mark_incomplete and the ledger refuse `_x1`, naming Gym's rule."""
    attempts = (
        lambda: store.put(make_entry(bad, "c1", [1], [2])),
        lambda: store.begin_call(bad, "c1"),
        lambda: store.mark_incomplete(bad, "c1"),
        lambda: store.record_ledger_row(bad, {}),
        lambda: store.record_ledger_failure(bad, "c1", "engine crashed"),
    )
    for attempt in attempts:
        with pytest.raises(InvalidRolloutId, match=re.escape(WRITERS_RULE)):
            await attempt()
    assert await store.admin.status(bad) is None


async def test_a_capture_under_such_an_id_can_still_be_read_and_deleted(store: Any) -> None:
    """Freeze and delete still take `_x1`: a capture stored before the rule is removable."""
    assert (await store.freeze("_x1")).entries == ()
    assert await store.admin.delete("_x1")
    assert await store.admin.status("_x1") is None


@pytest.mark.parametrize("bad", [b for b in BAD_CALL_IDS if b])
async def test_bad_call_ids_are_refused(store: Any, bad: str) -> None:
    """Call ids with a control character, a lone surrogate or over 200 characters are refused."""
    for attempt in (lambda: store.begin_call("r1", bad), lambda: store.mark_incomplete("r1", bad)):
        with pytest.raises(InvalidRolloutId):
            await attempt()
    with pytest.raises(TokenEntryError):
        await store.put(make_entry("r1", "c1", [1], [2]) | {"model_call_id": bad})
    assert await store.admin.status("r1") is None


@pytest.mark.parametrize("call_id", ENGINE_CALL_IDS)
async def test_engine_call_ids_round_trip_through_every_store(store: Any, call_id: str) -> None:
    """A call id with colons, slashes, braces or non-ASCII letters is put, announced and frozen
    unchanged; its announcement matches its entry (the snapshot is complete)."""
    await store.begin_call("r1", call_id)
    await store.put(make_entry("r1", call_id, [1], [2]))
    snapshot = await store.freeze("r1")
    assert (_ids(snapshot), snapshot.incomplete) == ([call_id], False)


@pytest.mark.parametrize("call_id", ENGINE_CALL_IDS)
async def test_engine_call_ids_can_be_marked_failed(store: Any, call_id: str) -> None:
    """Marking such a call failed makes the snapshot incomplete, the id unchanged."""
    await store.mark_incomplete("r1", call_id)
    assert (await store.freeze("r1")).incomplete is True


# -- administration (every store) -----------------------------------------------------------


async def test_status_of_unknown_rollout_is_none(admin_store: Any) -> None:
    """Nothing stored: status is None."""
    assert await admin_store.admin.status("ghost") is None


async def test_status_reports_the_state_and_line_digests(admin_store: Any) -> None:
    """Status shows the flags, the version and sha256 of each stored line."""
    entry = make_entry("r1", "c1", [1], [2])
    await admin_store.put(entry)
    snapshot = await admin_store.freeze("r1")
    state = await admin_store.admin.status("r1")
    digest = hashlib.sha256(dumps_entry_line(entry)).hexdigest()
    assert state.entry_digests == {"c1": digest}
    assert (state.frozen, state.retired, state.incomplete) == (True, False, False)
    assert (state.snapshot_id, state.version) == (snapshot.snapshot_id, snapshot.version)


async def test_same_payload_in_other_bytes_is_a_no_op(admin_store: Any) -> None:
    """A repeat whose JSON differs only in spelling (0 vs 0.0) is the same payload."""
    await admin_store.put(make_entry("r1", "c1", [1], [2], created_at=0))
    await admin_store.put(make_entry("r1", "c1", [1], [2], created_at=0.0))
    snapshot = await admin_store.freeze("r1")
    assert (_ids(snapshot), snapshot.version, snapshot.incomplete) == (["c1"], 2, False)


async def test_rollout_ids_lists_every_stored_rollout(admin_store: Any) -> None:
    """Open, frozen and retired rollouts are all listed, sorted."""
    await admin_store.put(make_entry("open", "c1", [1], [2]))
    await admin_store.freeze("frozen")
    await _retired(admin_store, "retired")
    assert await admin_store.admin.rollout_ids() == ["frozen", "open", "retired"]


async def test_delete_removes_the_rollout_and_its_tombstone(admin_store: Any) -> None:
    """After an admin delete the rollout is gone, and may be written from scratch."""
    await _retired(admin_store)
    await admin_store.admin.delete("r1")
    assert await admin_store.admin.status("r1") is None
    assert await admin_store.admin.rollout_ids() == []
    await admin_store.put(make_entry("r1", "c1", [1], [2]))


async def test_sweep_removes_old_tombstones_only(admin_store: Any) -> None:
    """Retired tombstones past the age go; frozen unretired captures and open ones stay."""
    for rollout_id in ("frozen", "open"):
        await admin_store.put(make_entry(rollout_id, "c1", [1], [2]))
    await _retired(admin_store, "retired")
    await admin_store.freeze("frozen")
    swept = await swept_captures(admin_store, retired_older_than=60, now=time.time() + 3600)
    assert [(s.rollout_id, s.reason) for s in swept] == [("retired", "retired")]
    assert await admin_store.admin.rollout_ids() == ["frozen", "open"]


async def test_sweep_keeps_fresh_tombstones(admin_store: Any) -> None:
    """A tombstone younger than the age stays."""
    await _retired(admin_store)
    assert await swept_captures(admin_store, retired_older_than=3600) == []
    assert await admin_store.admin.rollout_ids() == ["r1"]


async def test_sweep_removes_abandoned_captures_only_when_asked(admin_store: Any) -> None:
    """Never-frozen quiet captures go only with abandoned_older_than; frozen ones never."""
    await admin_store.put(make_entry("open", "c1", [1], [2]))
    await admin_store.freeze("frozen")
    later = time.time() + 3600
    assert await swept_captures(admin_store, retired_older_than=60, now=later) == []
    swept = await swept_captures(
        admin_store, retired_older_than=60, abandoned_older_than=60, now=later
    )
    assert [(s.rollout_id, s.reason) for s in swept] == [("open", "abandoned")]
    assert await admin_store.admin.rollout_ids() == ["frozen"]


async def test_sweep_dry_run_removes_nothing(admin_store: Any) -> None:
    """A dry run reports what it would remove and leaves it."""
    await admin_store.put(make_entry("open", "c1", [1], [2]))
    swept = await swept_captures(
        admin_store,
        retired_older_than=60,
        abandoned_older_than=60,
        now=time.time() + 3600,
        dry_run=True,
    )
    assert [s.rollout_id for s in swept] == ["open"]
    assert await admin_store.admin.status("open") is not None
