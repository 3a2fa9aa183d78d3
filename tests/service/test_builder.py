"""Prefix merging of seed snapshots, through the build it yields."""

from __future__ import annotations

from typing import Any

from tests.support.captures import agent_rollout, assert_prefix_contiguous, make_entry, snapshot_of
from token_finalizer import rebuild_snapshot


def _build(*entries: dict[str, Any], incomplete: bool = False) -> dict[str, Any]:
    return rebuild_snapshot(snapshot_of(list(entries), incomplete=incomplete), model="m").to_dict()


def _call(call_id: str, prompt: list[int], generation: list[int], **kw: Any) -> dict[str, Any]:
    return make_entry("r", call_id, prompt, generation, **kw)


def _chain_ids(build: dict[str, Any]) -> list[str]:
    return [item["content"].removeprefix("call ") for item in build["rebuilt_response"]["output"]]


def test_linear_chain_is_one_clean_chain() -> None:
    """Three calls that extend each other form one chain, unmasked, all tokens delivered."""
    build = _build(
        _call("c1", [1, 2], [3]),
        _call("c2", [1, 2, 3, 10], [4]),
        _call("c3", [1, 2, 3, 10, 4, 11], [5, 6]),
    )
    assert build["mask_sample"] is False
    assert build["metrics"]["chains"] == 1 and build["metrics"]["roots"] == 1
    assert build["metrics"]["delivered_fraction"] == 1.0
    assert _chain_ids(build) == ["c1", "c2", "c3"]


def test_retry_resolved_by_extension_keeps_the_extended_attempt() -> None:
    """Of two retries, the one a later call extends is kept; the other is quarantined."""
    build = _build(
        _call("root", [1], [2]),
        _call("try-a", [1, 2, 7], [8]),
        _call("try-b", [1, 2, 7], [9]),
        _call("next", [1, 2, 7, 9, 5], [6]),
    )
    assert build["mask_sample"] is False
    assert build["unresolved_retries"] == []
    assert build["metrics"]["quarantined_calls"] == 1
    assert _chain_ids(build) == ["root", "try-b", "next"]


def test_retry_of_the_final_call_is_unresolved_and_masked() -> None:
    """Retries nobody extends: keep the smallest id, list all of them, mask the record."""
    build = _build(
        _call("root", [1], [2]),
        _call("last-2", [1, 2, 7], [8]),
        _call("last-1", [1, 2, 7], [9]),
    )
    assert build["mask_sample"] is True
    assert build["unresolved_retries"] == ["last-1", "last-2"]
    assert _chain_ids(build) == ["root", "last-1"]


def test_ambiguous_parent_quarantines_the_call_and_drops_its_subtree() -> None:
    """An ambiguous parent marks only that call; its subtree still leaves every chain."""
    build = _build(
        _call("a", [1], [2, 3]),
        _call("b", [1, 2], [3]),
        _call("child", [1, 2, 3, 9], [4]),
        _call("grandchild", [1, 2, 3, 9, 4, 10], [5]),
    )
    assert build["metrics"]["quarantined_calls"] == 1
    assert build["metrics"]["roots"] == 2
    assert build["mask_sample"] is True
    assert "child" not in _chain_ids(build) and "grandchild" not in _chain_ids(build)


def test_second_root_after_compaction_is_masked_and_main_is_earliest_root() -> None:
    """A compacted context starts a second root: masked, and the earliest root's chain is main."""
    build = _build(
        _call("c1", [1, 2], [3], created_at=10.0),
        _call("c2", [1, 2, 3, 4], [5], created_at=11.0),
        _call("c3", [100, 101], [102], created_at=12.0),
        _call("c4", [100, 101, 102, 103], [104], created_at=13.0),
    )
    assert build["metrics"]["roots"] == 2 and build["metrics"]["chains"] == 2
    assert build["mask_sample"] is True
    assert _chain_ids(build) == ["c1", "c2"]
    assert build["metrics"]["delivered_fraction"] == 0.5


def test_auxiliary_root_that_finished_first_becomes_main_and_masks() -> None:
    """Main is chosen by (created_at, id) alone, so an earlier auxiliary root wins and masks."""
    build = _build(
        _call("agent-1", [1, 2], [3], created_at=20.0),
        _call("agent-2", [1, 2, 3, 4], [5], created_at=21.0),
        _call("summary", [50, 51, 52], [53], created_at=15.0),
    )
    assert _chain_ids(build) == ["summary"]
    assert build["mask_sample"] is True and build["metrics"]["roots"] == 2


def test_main_chain_ignores_entry_order() -> None:
    """The agent root is main when it was created first, whatever order the store lists entries."""
    build = _build(
        _call("summary", [50, 51, 52], [53], created_at=30.0),
        _call("agent-2", [1, 2, 3, 4], [5], created_at=21.0),
        _call("agent-1", [1, 2], [3], created_at=20.0),
    )
    assert _chain_ids(build) == ["agent-1", "agent-2"]


def test_empty_generations_are_excluded_and_counted() -> None:
    """Calls that generated nothing are left out of the chain and counted."""
    build = _build(
        _call("c1", [1], [2]),
        _call("empty", [1, 2, 3], []),
        _call("c2", [1, 2, 3], [4]),
    )
    assert build["metrics"]["empty_generation_calls"] == 1
    assert build["metrics"]["n_calls"] == 3
    assert build["mask_sample"] is False
    assert _chain_ids(build) == ["c1", "c2"]


def test_only_empty_generations_fail_the_build() -> None:
    """With nothing generated there is no chain: a failed, masked build."""
    build = _build(_call("c1", [1], []), _call("c2", [1, 2], []))
    assert build["rebuilt_response"] is None and build["mask_sample"] is True
    assert build["error"] == "ValueError: capture produced no safe trainable chain"
    assert build["metrics"]["n_calls"] == 2
    assert build["metrics"]["terminal_attribution"]["chain"] == "error"


def test_branches_mask_and_main_is_the_first_branch() -> None:
    """A fork (two children with different prompts) yields two chains and a masked record."""
    build = _build(
        _call("root", [1], [2]),
        _call("left", [1, 2, 3], [4]),
        _call("right", [1, 2, 5], [6]),
    )
    assert build["metrics"]["chains"] == 2 and build["metrics"]["roots"] == 1
    assert build["mask_sample"] is True
    assert _chain_ids(build) == ["root", "left"]


def test_quarantined_fraction_and_delivery_are_rounded() -> None:
    """Fractions are rounded to four places; a thrown-away retry still counts as captured."""
    build = _build(
        _call("root", [1], [2]),
        _call("a", [1, 2, 3], [4]),
        _call("b", [1, 2, 3], [5]),
    )
    assert build["metrics"]["quarantined_fraction"] == round(1 / 3, 4)
    assert build["metrics"]["delivered_fraction"] == round(2 / 3, 4)


def test_incomplete_snapshot_masks_a_good_chain() -> None:
    """An incomplete capture still builds but is masked and says so."""
    build = _build(_call("c1", [1], [2]), incomplete=True)
    assert build["rebuilt_response"] is not None
    assert build["mask_sample"] is True
    assert build["metrics"]["capture_incomplete"] is True


def test_duplicate_call_ids_fail_the_build() -> None:
    """Two entries under one model_call_id cannot be ordered: the build fails."""
    build = _build(_call("c1", [1], [2]), _call("c1", [1, 2, 3], [4]))
    assert build["rebuilt_response"] is None
    assert "duplicate model_call_id" in build["error"]


def test_thousand_turn_rollout_builds_without_recursion() -> None:
    """A 1000-call chain builds into one contiguous chain."""
    build = rebuild_snapshot(
        snapshot_of(agent_rollout("deep", calls=1000, new_tokens_per_turn=4)), model="m"
    ).to_dict()
    assert build["mask_sample"] is False
    assert build["metrics"]["chains"] == 1
    assert len(build["rebuilt_response"]["output"]) == 1000
    assert_prefix_contiguous(build["rebuilt_response"]["output"])


def test_all_calls_quarantined_fails_the_build() -> None:
    """When every path holds a quarantined call there is no chain: a failed build."""
    build = _build(
        _call("a", [1], [2]),
        _call("b", [1], [2]),
        _call("child", [1, 2, 3], [4]),
    )
    assert build["rebuilt_response"] is None
    assert build["error"] == "ValueError: capture produced no safe trainable chain"
