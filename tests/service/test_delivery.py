"""The seed's delivery API (docs/records-and-builds.md#delivery-functions)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.captures import assert_prefix_contiguous, make_entry, record_for
from tests.support.stores import stored_state
from token_finalizer import FileTokenStore, MemoryTokenStore, Snapshot
from token_finalizer.core.delivery import (
    _REDUNDANT_CAPTURE_KEY,
    MASK_SAMPLE_KEY,
    TOKEN_CAPTURE_KEY,
    _unusable,
    capture_build_can_retire,
    finalize_rollout_token_capture,
    retire_rollout_token_capture,
    rollout_carries_token_ids,
)

pytestmark = pytest.mark.anyio


async def _stored(store: MemoryTokenStore, rollout_id: str = "r1") -> MemoryTokenStore:
    await store.put(make_entry(rollout_id, "c1", [1, 2], [3]))
    await store.put(make_entry(rollout_id, "c2", [1, 2, 3, 9], [4, 5]))
    return store


class _Exploding:
    """A source whose every call fails."""

    async def freeze(self, rollout_id: str) -> Snapshot:
        raise RuntimeError("store on fire")

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        raise RuntimeError("store on fire")

    async def close(self) -> None:
        return None


class _Nonsense:
    """A source that answers something that is not a snapshot."""

    async def freeze(self, rollout_id: str) -> Any:
        return 42

    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        return True

    async def close(self) -> None:
        return None


def test_constants_match_the_seed() -> None:
    """The seed's key names are exact."""
    assert (MASK_SAMPLE_KEY, TOKEN_CAPTURE_KEY, _REDUNDANT_CAPTURE_KEY) == (
        "mask_sample",
        "_ng_token_capture",
        "_redundant_capture",
    )


async def test_no_source_returns_none_and_leaves_record() -> None:
    """With no source the caller does not rebuild: None, record untouched."""
    record = record_for("r1")
    before = copy.deepcopy(record)
    assert await finalize_rollout_token_capture(record, None) is None
    assert record == before


async def test_success_replaces_only_response_output(memory_store: MemoryTokenStore) -> None:
    """A good build replaces response.output and adds the capture metrics; nothing else changes."""
    await _stored(memory_store)
    record = record_for("r1", verifier={"score": 0.5})
    before = copy.deepcopy(record)
    build = await finalize_rollout_token_capture(record, memory_store)
    assert build is not None and build["mask_sample"] is False
    assert record["response"]["output"] == build["rebuilt_response"]["output"]
    assert record[TOKEN_CAPTURE_KEY] == build["metrics"]
    assert MASK_SAMPLE_KEY not in record
    untouched = {k: v for k, v in record.items() if k not in {"response", TOKEN_CAPTURE_KEY}}
    assert untouched == {k: v for k, v in before.items() if k != "response"}
    assert {k: v for k, v in record["response"].items() if k != "output"} == {
        k: v for k, v in before["response"].items() if k != "output"
    }
    assert_prefix_contiguous(record["response"]["output"])


async def test_result_is_plain_json(memory_store: MemoryTokenStore) -> None:
    """In-process callers get plain lists, so the stdlib can serialize the record."""
    await _stored(memory_store)
    record = record_for("r1")
    await finalize_rollout_token_capture(record, memory_store)
    assert json.loads(json.dumps(record))["response"]["output"][1]["generation_token_ids"] == [4, 5]


async def test_record_without_response_gets_the_rebuilt_response(
    memory_store: MemoryTokenStore,
) -> None:
    """A record with no response object gets the whole rebuilt response."""
    await _stored(memory_store)
    record = {"_ng_rollout_id": "r1", "reward": 0.0}
    build = await finalize_rollout_token_capture(record, memory_store)
    assert record["response"] is build["rebuilt_response"]
    assert record["response"]["id"] == "proj-r1"


async def test_build_carries_the_snapshot_it_consumed(memory_store: MemoryTokenStore) -> None:
    """The build names the frozen snapshot (id and version) for a later retire."""
    await _stored(memory_store)
    build = await finalize_rollout_token_capture(record_for("r1"), memory_store)
    state = stored_state(memory_store, "r1")
    assert build["_capture_snapshot"] == {
        "snapshot_id": state.snapshot_id,
        "version": state.version,
    }


async def test_malformed_id_is_unusable(memory_store: MemoryTokenStore) -> None:
    """A malformed id masks the record with 'malformed rollout id: ...' and no snapshot."""
    record = record_for("bad/id")
    build = await finalize_rollout_token_capture(record, memory_store)
    assert build["error"].startswith("malformed rollout id: ")
    assert "_capture_snapshot" not in build
    assert record[MASK_SAMPLE_KEY] is True
    assert record[TOKEN_CAPTURE_KEY] == {
        "n_calls": 0,
        "error": build["error"],
        "mask_reason": "malformed_rollout_id",
    }


async def test_missing_id_is_unusable(memory_store: MemoryTokenStore) -> None:
    """A record naming no rollout masks with 'no capture key'."""
    record = {"response": {"output": []}}
    build = await finalize_rollout_token_capture(record, memory_store)
    assert build == {
        "rebuilt_response": None,
        "mask_sample": True,
        "mask_reason": "no_capture_key",
        "error": "no capture key",
        "metrics": {"n_calls": 0, "error": "no capture key", "mask_reason": "no_capture_key"},
    }


async def test_record_with_token_ids_is_left_alone_and_redundant(
    memory_store: MemoryTokenStore,
) -> None:
    """A record already carrying token ids is unchanged; its capture is frozen for retirement."""
    await _stored(memory_store)
    record = record_for("r1")
    record["response"]["output"][0]["generation_token_ids"] = [7]
    before = copy.deepcopy(record)
    build = await finalize_rollout_token_capture(record, memory_store)
    assert record == before
    assert build["_redundant_capture"] is True and build["mask_sample"] is False
    assert capture_build_can_retire(build)
    assert await retire_rollout_token_capture("r1", memory_store, build) is True


async def test_record_with_token_ids_and_no_id_returns_none(
    memory_store: MemoryTokenStore,
) -> None:
    """Token ids but no capture key: nothing to freeze, None."""
    record = {"response": {"output": [{"generation_token_ids": [1]}]}}
    assert await finalize_rollout_token_capture(record, memory_store) is None


async def test_redundant_capture_with_failing_freeze_returns_none() -> None:
    """If the redundant capture cannot be frozen, None and the record unchanged."""
    record = record_for("r1")
    record["response"]["output"][0]["generation_token_ids"] = [7]
    before = copy.deepcopy(record)
    assert await finalize_rollout_token_capture(record, _Exploding()) is None
    assert record == before


async def test_empty_snapshot_is_masked_with_its_reason(memory_store: MemoryTokenStore) -> None:
    """A rollout that captured nothing is masked: 'capture contains no token records'."""
    record = record_for("never-written")
    build = await finalize_rollout_token_capture(record, memory_store)
    assert build["error"] == "capture contains no token records"
    assert build["_capture_snapshot"]["snapshot_id"]
    assert record[MASK_SAMPLE_KEY] is True
    assert record[TOKEN_CAPTURE_KEY]["error"] == build["error"]


async def test_empty_snapshot_hint_names_store_delete(memory_store: MemoryTokenStore) -> None:
    """The guidance on an empty capture is the build's and the record's `hint`, not its error."""
    record = record_for("never-written")
    build = await finalize_rollout_token_capture(record, memory_store)
    assert "token-finalizer store delete never-written" in build["hint"]
    assert record[TOKEN_CAPTURE_KEY]["hint"] == build["hint"]


async def test_empty_snapshot_hint_names_the_store_it_came_from(tmp_path: Path) -> None:
    """From a file store, the hint's `store delete` names the store's `--dir` too."""
    record = record_for("never-written")
    build = await finalize_rollout_token_capture(record, FileTokenStore(tmp_path / "capture"))
    assert f"`token-finalizer store delete never-written --dir {tmp_path}/capture`" in build["hint"]


async def test_incomplete_by_mark_masks(memory_store: MemoryTokenStore) -> None:
    """A call marked as failed to capture makes the snapshot incomplete and the record masked."""
    await _stored(memory_store)
    await memory_store.mark_incomplete("r1", "c3")
    record = record_for("r1")
    build = await finalize_rollout_token_capture(record, memory_store)
    assert build["mask_sample"] is True and build["metrics"]["capture_incomplete"] is True
    assert record[MASK_SAMPLE_KEY] is True
    assert not capture_build_can_retire(build)


async def test_incomplete_by_announced_call_masks(memory_store: MemoryTokenStore) -> None:
    """An announced call that never recorded an entry makes the snapshot incomplete."""
    await _stored(memory_store)
    await memory_store.begin_call("r1", "c3")
    build = await finalize_rollout_token_capture(record_for("r1"), memory_store)
    assert build["metrics"]["capture_incomplete"] is True and build["mask_sample"] is True


async def test_announced_call_that_arrived_is_complete(memory_store: MemoryTokenStore) -> None:
    """An announced call whose entry arrived does not make the snapshot incomplete."""
    await memory_store.begin_call("r1", "c1")
    await _stored(memory_store)
    build = await finalize_rollout_token_capture(record_for("r1"), memory_store)
    assert build["mask_sample"] is False


async def test_freeze_failure_is_masked_without_snapshot() -> None:
    """A failing freeze masks with '<Type>: <message>' and carries no snapshot."""
    record = record_for("r1")
    build = await finalize_rollout_token_capture(record, _Exploding())
    assert build["error"] == "RuntimeError: store on fire"
    assert "_capture_snapshot" not in build
    assert record[TOKEN_CAPTURE_KEY]["error"] == "RuntimeError: store on fire"


async def test_unexpected_source_answer_never_raises() -> None:
    """A source answering nonsense is an unusable record, not an exception."""
    record = record_for("r1")
    build = await finalize_rollout_token_capture(record, _Nonsense())  # type: ignore[arg-type]  # a bad source on purpose
    assert build["mask_sample"] is True and build["error"].startswith("AttributeError: ")
    assert record[MASK_SAMPLE_KEY] is True


def test_unusable_shape() -> None:
    """_unusable masks the record and returns the build with the reason and no snapshot."""
    record: dict[str, Any] = {}
    build = _unusable(record, "why", "message for the log")
    assert record == {"mask_sample": True, "_ng_token_capture": {"n_calls": 0, "error": "why"}}
    assert build == {
        "rebuilt_response": None,
        "mask_sample": True,
        "error": "why",
        "metrics": {"n_calls": 0, "error": "why"},
    }


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ([{"generation_token_ids": [1]}], True),
        ([{"generation_token_ids": []}], False),
        ([{"type": "message"}], False),
        (["text"], False),
        ("not a list", False),
    ],
)
def test_rollout_carries_token_ids(output: Any, expected: bool) -> None:
    """True only for an output item that is an object with non-empty generation_token_ids."""
    assert rollout_carries_token_ids({"response": {"output": output}}) is expected


@pytest.mark.parametrize(
    ("built", "expected"),
    [
        (None, False),
        ({"rebuilt_response": {"output": []}, "mask_sample": True}, False),
        ({"rebuilt_response": {"output": []}, "mask_sample": False}, True),
        ({"rebuilt_response": None, "mask_sample": False, "_redundant_capture": True}, True),
        ({"rebuilt_response": None, "mask_sample": False}, False),
    ],
)
def test_capture_build_can_retire(built: Any, expected: bool) -> None:
    """Only unmasked builds that consumed a snapshot can retire."""
    assert capture_build_can_retire(built) is expected


async def test_retire_drops_exactly_the_snapshot(memory_store: MemoryTokenStore) -> None:
    """Retiring a good build drops the store's snapshot."""
    await _stored(memory_store)
    build = await finalize_rollout_token_capture(record_for("r1"), memory_store)
    assert await retire_rollout_token_capture("r1", memory_store, build) is True
    assert stored_state(memory_store, "r1").retired is True


async def test_masked_build_is_never_retired(memory_store: MemoryTokenStore) -> None:
    """A masked build is kept as evidence: retire refuses and the capture stays."""
    await _stored(memory_store)
    await memory_store.mark_incomplete("r1")
    build = await finalize_rollout_token_capture(record_for("r1"), memory_store)
    assert await retire_rollout_token_capture("r1", memory_store, build) is False
    assert stored_state(memory_store, "r1").retired is False


async def test_retire_without_source_is_false(memory_store: MemoryTokenStore) -> None:
    """No source: nothing to retire."""
    await _stored(memory_store)
    build = await finalize_rollout_token_capture(record_for("r1"), memory_store)
    assert await retire_rollout_token_capture("r1", None, build) is False


async def test_retire_without_snapshot_reference_is_false(memory_store: MemoryTokenStore) -> None:
    """A retirable-looking build with no _capture_snapshot is refused."""
    built = {"rebuilt_response": {"output": []}, "mask_sample": False}
    assert await retire_rollout_token_capture("r1", memory_store, built) is False


async def test_retire_swallows_source_errors() -> None:
    """A drop that raises is a False, not an exception."""
    built = {
        "rebuilt_response": {"output": []},
        "mask_sample": False,
        "_capture_snapshot": {"snapshot_id": "s", "version": 1},
    }
    assert await retire_rollout_token_capture("r1", _Exploding(), built) is False


async def test_retire_with_stale_version_is_false(memory_store: MemoryTokenStore) -> None:
    """A build whose snapshot version is stale does not drop the newer state."""
    await _stored(memory_store)
    build = await finalize_rollout_token_capture(record_for("r1"), memory_store)
    await memory_store.mark_incomplete("r1", "late")
    assert await retire_rollout_token_capture("r1", memory_store, build) is False
    assert stored_state(memory_store, "r1").retired is False
