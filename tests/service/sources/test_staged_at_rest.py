"""Staged calls packed at rest in every store, invisible to readers.

`old_staged/calls.json` holds calls of every column shape (ids at and past
2**32 and 2**63, log probs that are and are not float32-exact, a one-token
delta) with what 0.4.0 stored and answered for them (written by
`old_staged/generate.py` against 0.4.0). A store of this version must answer
each exactly so: the plain and packed freeze snapshots byte for byte, fetch,
the direct freeze's snapshots. See docs/staging.md#packed-at-rest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.service.sources.conftest import open_store
from tests.service.sources.old_staged_calls import CALLS, IDS, RID, record_of
from token_finalizer.core.errors import CaptureConflict
from token_finalizer.core.staging import build_staged_call
from token_finalizer.store_server._answers import _packed_snapshot, _plain_snapshot

pytestmark = pytest.mark.anyio


async def _stage_all(store: Any) -> None:
    for call in CALLS:
        await store.stage(record_of(call), call["attachments"])
        await store.record_ledger_row(RID, call["ledger_row"])


def _expected(store: Any, form: str) -> list[bytes]:
    """What 0.4.0 answered for these calls from a store of this kind, `plain` or `packed`."""
    kind = "file" if hasattr(store, "directory") else "base"
    key = {
        ("file", "plain"): "file_plain_answer",
        ("file", "packed"): "file_packed_answer",
        ("base", "plain"): "redis_base_0_4_0",
        ("base", "packed"): "redis_packed_answer",
    }[kind, form]
    return [call[key].encode() for call in CALLS]


async def test_the_plain_freeze_answers_what_0_4_0_answered(store: Any) -> None:
    """Each staged snapshot of the plain freeze answer is 0.4.0's, byte for byte."""
    await _stage_all(store)
    await store.freeze(RID)
    frozen = await store.freeze_lines(RID)
    assert [_plain_snapshot(line) for line in frozen.staged.snapshots] == _expected(store, "plain")


async def test_the_packed_freeze_answers_what_0_4_0_answered(store: Any) -> None:
    """Each `?columns=packed` snapshot is 0.4.0's, byte for byte."""
    await _stage_all(store)
    await store.freeze(RID)
    frozen = await store.freeze_lines(RID)
    assert [_packed_snapshot(line) for line in frozen.staged.snapshots] == _expected(
        store, "packed"
    )


async def test_fetch_answers_each_base_snapshot_as_0_4_0_did(store: Any) -> None:
    """`fetch_staged` answers 0.4.0's base snapshot JSON for every column shape."""
    await _stage_all(store)
    fetched = await store.fetch_staged(RID, IDS)
    assert list(fetched) == _expected(store, "plain")


async def test_the_direct_freeze_gives_back_every_column_value_and_dtype(store: Any) -> None:
    """The finalizer's snapshots hold the staged columns exactly: values, widths and dtypes."""
    await _stage_all(store)
    snapshots = (await store.freeze(RID)).staged.snapshots
    for snapshot, call in zip(snapshots, CALLS, strict=True):
        staged = record_of(call).base_snapshot()
        for name in ("token_ids_delta", "token_mask_delta", "generation_log_probs_delta"):
            got, want = getattr(snapshot, name), getattr(staged, name)
            assert (got.dtype, got.tobytes()) == (want.dtype, want.tobytes()), name
        assert snapshot == staged


async def test_an_identical_restage_is_a_replay(store: Any) -> None:
    """Every call staged again, unchanged, stores nothing."""
    await _stage_all(store)
    replays = [await store.stage(record_of(call), call["attachments"]) for call in CALLS]
    assert replays == [False] * len(CALLS)


async def test_a_restage_with_other_columns_is_a_conflict(store: Any) -> None:
    """The second call staged again with one log prob changed is refused (409)."""
    await _stage_all(store)
    data = CALLS[1]["record"]
    first = record_of(CALLS[0])
    changed = build_staged_call(
        rollout_id=RID,
        model_call_id=data["model_call_id"],
        parent=first,
        prompt_token_ids=[*first.token_ids_delta.tolist(), *data["token_ids_delta"][:2]],
        generated_token_ids=data["token_ids_delta"][2:],
        generated_log_probs=[*data["generation_log_probs_delta"][2:-1], -9.0],
        weight_version=data["weight_version"],
    )
    with pytest.raises(CaptureConflict):
        await store.stage(changed, CALLS[1]["attachments"])


@pytest.mark.parametrize("kind", ["file", "redis"])
async def test_the_custody_walk_reads_ancestors_another_process_packed(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str
) -> None:
    """A call staged by a second process under packed ancestors it never parsed passes custody."""
    writer, other = open_store(request, kind, tmp_path), open_store(request, kind, tmp_path)
    try:
        for call in CALLS[:-1]:
            await writer.stage(record_of(call), call["attachments"])
        last = CALLS[-1]
        assert await other.stage(record_of(last), last["attachments"]) is True
    finally:
        await writer.close()
        await other.close()


def test_ids_past_2_63_are_among_the_shapes() -> None:
    """The vectors hold ids at and past 2**32 and 2**63 and a float64-only log prob."""
    ids = np.array(CALLS[0]["record"]["token_ids_delta"], dtype=np.uint64)
    assert int(ids.max()) >= 2**63 and any(2**32 <= int(i) < 2**63 for i in ids)
    log_probs = np.array(CALLS[1]["record"]["generation_log_probs_delta"])
    assert not np.array_equal(log_probs.astype(np.float32).astype(np.float64), log_probs)
