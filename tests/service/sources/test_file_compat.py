"""On-disk compatibility with NeMo Gym's training-token file store (docs/store-protocol.md)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.captures import agent_rollout, assert_prefix_contiguous, make_entry
from tests.support.packed import canonical_lines
from tests.support.stores import stored_state
from token_finalizer import FileTokenStore
from token_finalizer.core.delivery import finalize_rollout_token_capture

pytestmark = pytest.mark.anyio

STATE_KEYS = {
    "frozen",
    "retired",
    "incomplete",
    "snapshot_id",
    "version",
    "entry_digests",
    "indexed_size",
}


def _write_like_a_foreign_writer(directory: Path, entries: list[dict[str, Any]]) -> None:
    """Lay out a capture as another implementation would: stdlib json, same files and keys."""
    rollout_id = entries[0]["rollout_id"]
    lines = [json.dumps(e, sort_keys=True, separators=(",", ":")).encode() for e in entries]
    (directory / f"{rollout_id}.tokens.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
    state = {
        "frozen": False,
        "retired": False,
        "incomplete": False,
        "snapshot_id": None,
        "version": len(lines),
        "entry_digests": {
            e["model_call_id"]: hashlib.sha256(line).hexdigest()
            for e, line in zip(entries, lines, strict=True)
        },
        "indexed_size": sum(len(line) + 1 for line in lines),
    }
    (directory / f"{rollout_id}.tokens.state.json").write_text(json.dumps(state, indent=2))
    (directory / f"{rollout_id}.tokens.lock").touch()


async def test_foreign_directory_freezes_and_finalizes(capture_dir: Path) -> None:
    """A directory written by a stdlib-json writer with the shared layout finalizes here."""
    entries = agent_rollout("7-0", calls=5, new_tokens_per_turn=30)
    entries[0]["generation_log_probs"][0] = 1e-05  # formatted differently by json and orjson
    _write_like_a_foreign_writer(capture_dir, entries)
    record = {"_ng_task_index": 7, "_ng_rollout_index": 0, "response": {"output": []}}
    build = await finalize_rollout_token_capture(record, FileTokenStore(capture_dir))
    assert build["mask_sample"] is False
    output = record["response"]["output"]
    assert [item["generation_token_ids"] for item in output] == [
        e["generation_token_ids"] for e in entries
    ]
    assert output[0]["generation_log_probs"][0] == 1e-05
    assert_prefix_contiguous(output)


async def test_same_payload_from_another_serializer_is_idempotent(capture_dir: Path) -> None:
    """Re-putting a payload that another serializer stored with other bytes is not a conflict."""
    entry = make_entry("r1", "c1", [1], [2, 3], log_probs=[1e-05, -0.5])
    _write_like_a_foreign_writer(capture_dir, [entry])
    store = FileTokenStore(capture_dir)
    await store.put(entry)
    assert (capture_dir / "r1.tokens.jsonl").read_bytes().count(b"\n") == 1
    assert stored_state(store, "r1").incomplete is False


async def test_our_directory_reads_as_the_shared_format(
    file_store: FileTokenStore, capture_dir: Path
) -> None:
    """What we write reads back as stdlib-readable, compact, sorted lines, digested and
    indexed as specified."""
    for entry in agent_rollout("r1", calls=3, new_tokens_per_turn=20):
        await file_store.put(entry)
    await file_store.begin_call("r1", "call-00003")
    await file_store.mark_incomplete("r1", "call-00003")
    raw = (capture_dir / "r1.tokens.jsonl").read_bytes()
    lines = canonical_lines(raw)
    for line in lines:
        data = json.loads(line)
        compact = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert line == compact.encode()
    state = json.loads((capture_dir / "r1.tokens.state.json").read_text())
    assert set(state) == STATE_KEYS
    assert state["indexed_size"] == len(raw)
    assert state["entry_digests"] == {
        json.loads(line)["model_call_id"]: hashlib.sha256(line).hexdigest() for line in lines
    }
    assert (capture_dir / "r1.tokens.intents").read_text() == "call-00003\n"
    assert (capture_dir / "r1.tokens.incomplete").read_text() == "call-00003\n"
    assert state["incomplete"] is True and state["version"] == 4
