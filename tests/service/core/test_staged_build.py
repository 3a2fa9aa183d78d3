"""The staged build: receipt, verification, extras check and the verdict of one record.

The frozen rollouts here are built in memory (a `Snapshot` whose `staged`
holds the manifest and base snapshots a store would answer); the extras
come from a stand-in source. The vectors test the same path end to end
through the API (tests/service/api/test_finalize_staged_vectors.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from tests.support.staging_stores import Conversation
from token_finalizer.core.build import STAGED_BUILDER, BuildKind, MaskReason
from token_finalizer.core.entries import Snapshot
from token_finalizer.core.errors import StoreUnreachable
from token_finalizer.core.staged_build import build_staged
from token_finalizer.core.staging import (
    StagedCallBaseSnapshot,
    StagedCapture,
    build_receipt,
    failure_row,
    manifest_from_rows,
    verify_and_linearize,
)

pytestmark = pytest.mark.anyio

ROLLOUT = "staged-build"
ROUTED = {"routed_experts": [[1, 2], [3, 4]]}


class Extras:
    """A source's `fetch_extras`, over a dict; records which calls were asked for."""

    def __init__(self, extras: Mapping[str, Any], *, fails: Exception | None = None) -> None:
        self.extras = dict(extras)
        self.fails = fails
        self.asked: list[tuple[str, ...]] = []

    async def fetch_extras(
        self, rollout_id: str, call_ids: Sequence[str]
    ) -> Mapping[str, Mapping[str, Any] | None]:
        self.asked.append(tuple(call_ids))
        if self.fails is not None:
            raise self.fails
        return {call: self.extras[call] for call in call_ids if call in self.extras}


def _chat(calls: int = 3) -> Conversation:
    chat = Conversation(ROLLOUT)
    for index in range(1, calls + 1):
        chat.add(f"c{index}", extras=ROUTED if index == 2 else None)
    return chat


def _extras(chat: Conversation) -> Extras:
    return Extras({record.model_call_id: record.extras for record in chat.records})


def _snapshot(
    chat: Conversation,
    *,
    rows: list[dict[str, Any]] | None = None,
    snapshots: Sequence[StagedCallBaseSnapshot | None] | None = None,
    extras: Mapping[str, Any] | None = None,
) -> Snapshot:
    manifest = manifest_from_rows(ROLLOUT, chat.rows if rows is None else rows)
    if snapshots is None:
        by_id = {record.model_call_id: record.base_snapshot() for record in chat.records}
        snapshots = [by_id.get(record.model_call_id) for record in manifest.records]
    staged = StagedCapture(manifest=manifest, snapshots=tuple(snapshots), extras=extras)
    return Snapshot(ROLLOUT, (), False, "snap-1", 7, staged=staged)


def _bases(chat: Conversation) -> list[StagedCallBaseSnapshot]:
    return [record.base_snapshot() for record in chat.records]


def chat_manifest(chat: Conversation) -> Any:
    return manifest_from_rows(ROLLOUT, chat.rows)


def _record(call_id: str = "c3", **extra: Any) -> dict[str, Any]:
    return {"_ng_rollout_id": ROLLOUT, "response": {"id": f"resp-{call_id}"}, **extra}


async def test_a_verified_chain_is_the_terminals_row() -> None:
    """The row is the reference verifier's row of the record's terminal; the build is unmasked."""
    chat = _chat()
    build = await build_staged(_snapshot(chat), _record(), _extras(chat))
    assert build.staged is not None and build.staged.row is not None
    expected = verify_and_linearize(build_receipt(chat_manifest(chat), _record()), _bases(chat))
    assert build.staged.row.to_json() == expected.to_json()
    assert (build.kind, build.builder, build.mask_sample) == (
        BuildKind.STAGED,
        STAGED_BUILDER,
        False,
    )


async def test_the_response_id_picks_the_terminal() -> None:
    """A record scored on c2's response gets the row of c2's chain."""
    chat = _chat()
    build = await build_staged(_snapshot(chat), _record("c2"), _extras(chat))
    assert build.staged is not None and build.staged.row is not None
    assert build.staged.row.model_call_ids == ("c1", "c2")


async def test_a_verified_row_is_retirable() -> None:
    """Only a verified row carries permission to retire its snapshot."""
    chat = _chat()
    build = await build_staged(_snapshot(chat), _record(), _extras(chat))
    assert build.retirable


async def test_a_failure_row_masks_with_rollout_failed() -> None:
    """Any failure row poisons: mask reason rollout_failed, the reason as the detail, no row."""
    chat = _chat()
    rows = [*chat.rows, failure_row("c9", "worker_capture_failed")]
    build = await build_staged(_snapshot(chat, rows=rows), _record(), _extras(chat))
    assert build.staged is not None and build.staged.error is not None
    assert (build.mask_reason, build.staged.error.detail) == (
        MaskReason.ROLLOUT_FAILED,
        "worker_capture_failed",
    )
    assert (build.staged.row, build.retirable) == (None, False)


async def test_a_missing_staged_call_masks_with_our_code() -> None:
    """A manifest record the store does not hold: staged_record_missing, naming the call."""
    chat = _chat()
    snapshots = [chat.records[0].base_snapshot(), None, chat.records[2].base_snapshot()]
    build = await build_staged(_snapshot(chat, snapshots=snapshots), _record(), _extras(chat))
    assert build.staged is not None and build.staged.error is not None
    assert build.mask_reason is MaskReason.STAGED_RECORD_MISSING
    assert "c2" in build.staged.error.detail


async def test_a_poisoned_receipt_is_reported_before_a_missing_call() -> None:
    """The verifier's receipt verdict reads no snapshot: it comes before staged_record_missing."""
    chat = _chat()
    rows = [*chat.rows, failure_row("c2", "unresolved_parent")]
    snapshots = [chat.records[0].base_snapshot(), None, chat.records[2].base_snapshot()]
    build = await build_staged(_snapshot(chat, rows=rows, snapshots=snapshots), _record(), None)
    assert build.mask_reason is MaskReason.ROLLOUT_FAILED


async def test_a_graph_error_keeps_its_class() -> None:
    """A graph or chain failure is reported with its class, RebuildError, and its code."""
    chat = _chat()
    build = await build_staged(_snapshot(chat, rows=chat.rows[1:]), _record(), _extras(chat))
    assert build.staged is not None and build.staged.error is not None
    assert (build.staged.error.error_class, build.staged.error.code) == (
        "RebuildError",
        "missing_parent",
    )


async def test_extras_of_the_chain_are_read_once() -> None:
    """The extras of the terminal's chain are fetched in one call, in chain order."""
    chat = _chat()
    extras = _extras(chat)
    await build_staged(_snapshot(chat), _record("c2"), extras)
    assert extras.asked == [("c1", "c2")]


async def test_extras_the_freeze_carried_are_not_read_again() -> None:
    """A freeze that brought every call's extras is checked with them: no extras read."""
    chat = _chat()
    extras = _extras(chat)
    build = await build_staged(_snapshot(chat, extras=dict(extras.extras)), _record(), extras)
    assert (build.mask_reason, extras.asked) == (None, [])


async def test_extras_the_freeze_carried_are_checked_like_read_ones() -> None:
    """Extras carried by the freeze that hash elsewhere mask the build as read ones do."""
    chat = _chat()
    carried = {**_extras(chat).extras, "c2": {"routed_experts": [[9, 9], [9, 9]]}}
    build = await build_staged(_snapshot(chat, extras=carried), _record(), None)
    assert build.mask_reason is MaskReason.EXTRAS_DIGEST_MISMATCH


async def test_extras_that_hash_elsewhere_mask_the_build() -> None:
    """Fetched extras that do not hash to the row's commitment: extras_digest_mismatch."""
    chat = _chat()
    extras = _extras(chat)
    extras.extras["c2"] = {"routed_experts": [[9, 9], [9, 9]]}
    build = await build_staged(_snapshot(chat), _record(), extras)
    assert (build.mask_reason, build.retirable) == (MaskReason.EXTRAS_DIGEST_MISMATCH, False)


async def test_extras_not_fetched_mask_the_build() -> None:
    """A chain call whose extras the store does not answer: missing_extras."""
    chat = _chat()
    extras = _extras(chat)
    del extras.extras["c2"]
    build = await build_staged(_snapshot(chat), _record(), extras)
    assert build.mask_reason is MaskReason.MISSING_EXTRAS


async def test_a_source_without_extras_masks_the_build() -> None:
    """Without a way to read extras, no chain can be checked: missing_extras."""
    chat = _chat()
    build = await build_staged(_snapshot(chat), _record(), None)
    assert build.mask_reason is MaskReason.MISSING_EXTRAS


async def test_an_unreadable_extras_store_masks_with_missing_extras() -> None:
    """An extras read that fails (not for reachability) is missing_extras, with the cause."""
    chat = _chat()
    build = await build_staged(_snapshot(chat), _record(), Extras({}, fails=ValueError("torn")))
    assert build.staged is not None and build.staged.error is not None
    assert (build.mask_reason, "torn" in build.staged.error.detail) == (
        MaskReason.MISSING_EXTRAS,
        True,
    )


async def test_an_unreachable_extras_store_is_raised() -> None:
    """StoreUnreachable from the extras read goes to the caller (a 503, retried safely)."""
    chat = _chat()
    with pytest.raises(StoreUnreachable):
        await build_staged(_snapshot(chat), _record(), Extras({}, fails=StoreUnreachable("down")))


async def test_a_masked_record_keeps_its_row_but_is_not_retirable() -> None:
    """A record that arrived masked: the row is verified, the build masked record_masked."""
    chat = _chat()
    build = await build_staged(_snapshot(chat), _record(mask_sample=True), _extras(chat))
    assert build.staged is not None and build.staged.row is not None
    assert (build.mask_reason, build.retirable) == (MaskReason.RECORD_MASKED, False)


async def test_without_attribution_the_walk_picks_the_terminal() -> None:
    """terminal_attribution off: the record's witnesses are ignored, the heuristic decides."""
    chat = _chat()
    build = await build_staged(
        _snapshot(chat), _record("c2"), _extras(chat), terminal_attribution=False
    )
    assert build.staged is not None and build.staged.receipt is not None
    assert (
        build.staged.receipt.terminal_selection,
        build.staged.receipt.terminal_model_call_id,
    ) == (
        "heuristic",
        "c3",
    )


async def test_metrics_describe_the_manifest_and_the_row() -> None:
    """Metrics: manifest size, failures, missing calls, terminal, chain length and tokens."""
    chat = _chat()
    build = await build_staged(_snapshot(chat), _record(), _extras(chat))
    assert build.metrics == {
        "n_calls": 3,
        "failures": 0,
        "staged_records_missing": 0,
        "terminal_model_call_id": "c3",
        "terminal_selection": "response_id",
        "chain_length": 3,
        "tokens": chat.records[-1].cum_len,
        "generated_tokens": 6,
    }


async def test_duplicate_manifest_rows_answer_the_verifiers_code() -> None:
    """Two rows of one call id (a hand-edited ledger): duplicate_manifest_row, no receipt."""
    chat = _chat()
    rows = [*chat.rows, chat.rows[1]]
    build = await build_staged(_snapshot(chat, rows=rows), _record(), _extras(chat))
    assert build.staged is not None
    assert (build.mask_reason, build.staged.receipt) == (MaskReason.DUPLICATE_MANIFEST_ROW, None)


def test_every_verifier_code_is_a_mask_reason() -> None:
    """Every code the verification and the extras check can raise is a MaskReason value."""
    import inspect
    import re

    from token_finalizer.core.staging import verify

    source = inspect.getsource(verify)
    codes = set(re.findall(r'Error\(\s*"(\w+)"', source))
    codes |= {f"wrong_{name}" for name in (*verify._COMPARED_FIELDS, *verify._VERSION_FIELDS)}
    assert codes - {str(reason) for reason in MaskReason} == set()
    assert {"missing_extras", "corrupt_digest", "wrong_cumulative_hash"} <= codes
