"""Failed builds carry the mask reason chosen where they fail, whatever their error says.

Each failure path is run twice: as it is, and with its error text reworded.
The reason must be the same both times: texts are a contract for people
(docs/records-and-builds.md#error-strings), reasons for metrics and the
guard (docs/records-and-builds.md#mask-reasons), and neither is derived from
the other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tests.support.captures import make_entry, snapshot_of
from tests.support.lineage import stamp_lineage
from token_finalizer.core import projection, rebuild
from token_finalizer.core.build import Build, BuildFailed, MaskReason
from token_finalizer.core.entries import Snapshot
from token_finalizer.core.rebuild import rebuild_snapshot
from token_finalizer.core.token_digest import InvalidTokenIds

_REWORDED = "reworded for people"


def _empty() -> Snapshot:
    return snapshot_of([])


def _no_chain() -> Snapshot:
    entries = [make_entry("r", "c1", [1], []), make_entry("r", "c2", [1, 2], [])]
    return snapshot_of(entries)


def _not_contiguous() -> Snapshot:
    items = [{"type": "a", "generation_token_ids": [3]}, {"type": "b", "generation_token_ids": [3]}]
    entry = make_entry("r", "c1", [1], [3], output_items=items, token_item_index=None)
    return snapshot_of([entry])


def _duplicate_ids() -> Snapshot:
    entries = [make_entry("r", "c1", [1], [2]), make_entry("r", "c1", [1, 2, 3], [4])]
    return snapshot_of(entries)


def _out_of_range_ids() -> Snapshot:
    """A lineage snapshot whose entry, built by hand past validation, holds a negative id."""
    entries = [make_entry("r", "c1", [1, 2], [3]), make_entry("r", "c2", [1, 2, 3, 4], [5])]
    snapshot = snapshot_of(stamp_lineage(entries, {"c1": None, "c2": "c1"}))
    first, second = snapshot.entries
    negative = dataclasses.replace(first, prompt_token_ids=np.array([1, -2], dtype=np.int64))
    return dataclasses.replace(snapshot, entries=(negative, second))


# (case, snapshot, the module and name of its error text, the reason)
_FAILURES: list[tuple[str, Callable[[], Snapshot], Any, str, MaskReason]] = [
    ("empty", _empty, rebuild, "EMPTY_CAPTURE_ERROR", MaskReason.EMPTY_CAPTURE),
    ("no chain", _no_chain, rebuild, "NO_CHAIN_ERROR", MaskReason.NO_TRAINABLE_CHAIN),
    (
        "not contiguous",
        _not_contiguous,
        projection,
        "NOT_CONTIGUOUS_ERROR",
        MaskReason.NOT_PREFIX_CONTIGUOUS,
    ),
    (
        "duplicate ids",
        _duplicate_ids,
        rebuild,
        "DUPLICATE_CALL_ID_ERROR",
        MaskReason.DUPLICATE_CALL_ID,
    ),
]


@pytest.mark.parametrize(
    ("make", "reason"),
    [(make, reason) for _, make, _, _, reason in _FAILURES]
    + [(_out_of_range_ids, MaskReason.INVALID_TOKENS)],
    ids=[case for case, *_ in _FAILURES] + ["out-of-range ids"],
)
def test_each_failure_path_names_its_reason(
    make: Callable[[], Snapshot], reason: MaskReason
) -> None:
    """Every way a build fails yields a failed, masked build with its own reason."""
    build = rebuild_snapshot(make())
    assert (build.rebuilt_response, build.mask_sample) == (None, True)
    assert build.mask_reason is reason


@pytest.mark.parametrize(
    ("make", "module", "name", "reason"),
    [(make, module, name, reason) for _, make, module, name, reason in _FAILURES],
    ids=[case for case, *_ in _FAILURES],
)
def test_rewording_an_error_keeps_its_reason(
    monkeypatch: pytest.MonkeyPatch,
    make: Callable[[], Snapshot],
    module: Any,
    name: str,
    reason: MaskReason,
) -> None:
    """With its error text reworded, a failure still yields the same reason."""
    monkeypatch.setattr(module, name, _REWORDED)
    build = rebuild_snapshot(make())
    assert build.error is not None and build.error.startswith(_REWORDED)
    assert build.mask_reason is reason


def _one_call() -> Snapshot:
    return snapshot_of([make_entry("r", "c1", [1], [2])])


def _link_raising(exc: Exception) -> Callable[..., Any]:
    def link(*args: Any) -> Any:
        raise exc

    return link


def test_reworded_token_id_error_keeps_invalid_token_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """A digest refusal of token ids is invalid_token_ids whatever its message says."""
    monkeypatch.setattr(rebuild, "_link", _link_raising(InvalidTokenIds(_REWORDED)))
    build = rebuild_snapshot(_duplicate_ids())
    assert (build.error, build.mask_reason) == (
        f"ValueError: {_REWORDED}",
        MaskReason.INVALID_TOKENS,
    )


def test_other_value_error_worded_like_a_token_id_error_is_build_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ValueError that only reads like a token-id error is not taken for one."""
    text = "token ids must be non-negative, got -1"
    monkeypatch.setattr(rebuild, "_link", _link_raising(ValueError(text)))
    build = rebuild_snapshot(_one_call())
    assert build.error == f"ValueError: {text}"
    assert build.mask_reason is MaskReason.BUILD_FAILED


def test_failure_of_an_incomplete_snapshot_is_capture_incomplete() -> None:
    """An incomplete snapshot's failure is reported as capture_incomplete, the first reason."""
    entries = [make_entry("r", "c1", [1], []), make_entry("r", "c2", [1, 2], [])]
    build: Build = rebuild_snapshot(snapshot_of(entries, incomplete=True))
    assert build.error == projection.NO_CHAIN_ERROR
    assert build.mask_reason is MaskReason.CAPTURE_INCOMPLETE


def test_projection_without_generated_tokens_names_no_trainable_tokens() -> None:
    """Projecting a chain with no generated token fails with no_trainable_tokens."""
    with pytest.raises(BuildFailed) as failed:
        projection.project_response([], rollout_id="r", model="m")
    assert (str(failed.value), failed.value.reason) == (
        projection.NO_TOKENS_ERROR,
        MaskReason.NO_TRAINABLE_TOKENS,
    )


def test_empty_capture_error_is_gyms_exactly() -> None:
    """An empty capture's error is NeMo Gym's text and nothing more."""
    build = rebuild_snapshot(snapshot_of([]))
    assert build.error == "capture contains no token records"


def test_empty_capture_hint_says_the_id_is_frozen_and_how_to_free_it() -> None:
    """An empty capture's hint says finalize froze the id, and names `store delete`."""
    build = rebuild_snapshot(snapshot_of([]))
    assert build.hint == (
        "finalize froze rollout r all the same, so a later write to it is refused: if the id is "
        "wrong or its rollout was not finished, remove the capture with "
        "`token-finalizer store delete r`"
    )


def test_a_build_without_guidance_has_no_hint() -> None:
    """A build with nothing to add carries no `hint` key, in the build or the record."""
    build = rebuild_snapshot(snapshot_of([make_entry("r", "c1", [1, 2], [3])]))
    assert "hint" not in build.to_dict() and "hint" not in build.record_capture()


# -- a call stored twice (NeMo Gym 0.7 counts every stored line) ---------------------------


def _stored_twice(*, lineage: bool) -> Snapshot:
    """Calls c1 and c2, c1's line stored a second time (a relay that re-sent it)."""
    calls = [
        make_entry("r", "c1", [1, 2], [3], created_at=1.0),
        make_entry("r", "c2", [1, 2, 3, 4], [5], created_at=2.0),
    ]
    if lineage:
        calls = stamp_lineage(calls, {"c1": None, "c2": "c1"})
    return snapshot_of([*calls, dict(calls[0])])


@pytest.mark.parametrize("lineage", [False, True], ids=["seed", "lineage"])
def test_a_call_stored_twice_counts_twice_in_n_calls(lineage: bool) -> None:
    """Three stored lines for two calls: `n_calls` 3, as NeMo Gym 0.7 reports it."""
    build = rebuild_snapshot(_stored_twice(lineage=lineage))
    assert build.metrics["n_calls"] == 3


@pytest.mark.parametrize("lineage", [False, True], ids=["seed", "lineage"])
def test_a_call_stored_twice_is_built_once(lineage: bool) -> None:
    """The build is that of the two calls: one chain, both generations, not masked."""
    build = rebuild_snapshot(_stored_twice(lineage=lineage))
    assert build.rebuilt_response is not None
    generations = [
        item["generation_token_ids"].tolist() for item in build.rebuilt_response["output"]
    ]
    metrics = build.metrics
    assert (build.mask_sample, generations, metrics["chains"], metrics["roots"]) == (
        False,
        [[3], [5]],
        1,
        1,
    )
    assert (metrics["generated_tokens_captured"], metrics["quarantined_fraction"]) == (2, 0.0)
