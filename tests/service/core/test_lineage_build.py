"""Lineage snapshots (NeMo Gym 0.7 writers): the rules where our contract is explicit.

Most rules are checked case by case against the released package in
test_rebuild_vectors.py; these tests cover what the vectors cannot: where we
differ on purpose, and properties over random rollouts.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.captures import make_entry
from tests.support.lineage import stamp_lineage
from token_finalizer.core.codec import encode_json
from token_finalizer.core.entries import Snapshot, TokenEntry
from token_finalizer.core.rebuild import rebuild_snapshot


def _build(entries: list[dict[str, Any]], record: dict[str, Any] | None = None) -> dict[str, Any]:
    snapshot = Snapshot(
        "r",
        tuple(TokenEntry.from_dict(entry) for entry in entries),
        incomplete=False,
        snapshot_id="s",
        version=1,
    )
    build = rebuild_snapshot(snapshot, record=record or {}).to_dict()
    build.pop("_capture_snapshot")
    return build


def _chain(build: dict[str, Any]) -> list[str]:
    output = build["rebuilt_response"]["output"]
    return [item["content"].removeprefix("call ") for item in output]


def test_a_parent_processed_later_is_a_boundary_even_when_recovery_runs() -> None:
    """A claimed parent that is kept but not yet processed is `parent_call_id_missing`."""
    entries = stamp_lineage(
        [
            make_entry("r", "a", [1], [2]),
            make_entry("r", "b", [1, 2, 3], [4]),
            make_entry("r", "c", [1, 2, 3, 4, 5], [6]),
        ],
        {"a": None, "b": "a", "c": "b"},
    )
    entries[1]["parent_call_id"] = "c"  # b claims a later call: a claim that cannot hold
    entries[2]["parent_call_id"] = "gone"  # an absent parent: prefix recovery is active
    build = _build(entries)
    assert build["metrics"]["parent_link_failures"] == {
        "parent_call_id_missing": 1,
        "parent_call_id_missing_recovered": 1,
    }
    assert build["unresolved_parent_calls"] == ["b"]


def test_an_empty_parent_id_is_a_boundary() -> None:
    """`parent_call_id: ""` is `resolved_parent_missing_id`, never prefix-recovered."""
    entries = [
        make_entry("r", "a", [1], [2], parent_resolution="root"),
        make_entry("r", "b", [1, 2, 3], [4], parent_call_id=""),
    ]
    build = _build(entries)
    assert build["metrics"]["parent_link_failures"] == {"resolved_parent_missing_id": 1}
    assert (build["unresolved_parent_calls"], build["mask_sample"]) == (["b"], True)


def test_a_seed_snapshot_is_built_by_prefix_merging() -> None:
    """A capture with no lineage field builds its chain from token prefixes alone."""
    build = _build([make_entry("r", "a", [1], [2]), make_entry("r", "b", [1, 2, 3], [4])])
    assert (_chain(build), build["mask_sample"]) == (["a", "b"], False)
    assert build["metrics"]["parent_link_failures"] == {}


def test_delta_chain_deeper_than_the_limit_fails_only_the_deep_entries() -> None:
    """Entries more than 10,000 deltas from their anchor are unreconstructable, whatever order."""
    depth = 10_002
    entries = [make_entry("r", "c00000", [1], [2], output_items=[])]
    parents: dict[str, str | None] = {"c00000": None}
    for i in range(1, depth + 1):
        prompt = [1, 2] * i + [1]
        entries.append(make_entry("r", f"c{i:05d}", prompt, [2], output_items=[]))
        parents[f"c{i:05d}"] = f"c{i - 1:05d}"
    stamped = stamp_lineage(entries, parents, delta=True)
    random.Random(7).shuffle(stamped)
    build = _build(stamped)
    assert build["metrics"]["parent_link_failures"] == {"delta_chain_unreconstructable": 2}
    assert sorted(build["unresolved_parent_calls"]) == ["c10001", "c10002"]


@st.composite
def rollouts(draw: st.DrawFn) -> tuple[list[dict[str, Any]], dict[str, str | None]]:
    """A random 0.7 capture: extensions, retries, branches and new roots, with parents known."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    entries: list[dict[str, Any]] = []
    parents: dict[str, str | None] = {}
    for i in range(draw(st.integers(1, 12))):
        call_id = f"c{i:02d}"
        generation = [rng.randrange(3) for _ in range(rng.randint(1, 3))]
        if not entries or rng.random() < 0.15:
            prompt, parent = [rng.randrange(3) for _ in range(rng.randint(1, 4))], None
        else:
            chosen = rng.choice(entries)
            if rng.random() < 0.25:  # a retry: same prompt, same parent
                prompt, parent = list(chosen["prompt_token_ids"]), parents[chosen["model_call_id"]]
            else:
                interstitial = [rng.randrange(3) for _ in range(rng.randint(0, 2))]
                prompt = chosen["prompt_token_ids"] + chosen["generation_token_ids"] + interstitial
                parent = chosen["model_call_id"]
        entries.append(make_entry("r", call_id, prompt, generation, created_at=float(i)))
        parents[call_id] = parent
    return entries, parents


@settings(max_examples=200, deadline=None)
@given(rollouts())
def test_delta_and_full_prompts_build_identical_outputs(
    rollout: tuple[list[dict[str, Any]], dict[str, str | None]],
) -> None:
    """The same rollout written with full prompts and with delta prompts builds the same bytes."""
    entries, parents = rollout
    full = _build(stamp_lineage(entries, parents))
    delta = _build(stamp_lineage(entries, parents, delta=True))
    assert encode_json(delta) == encode_json(full)


@settings(max_examples=200, deadline=None)
@given(rollouts(), st.randoms(use_true_random=False))
def test_entry_order_never_changes_a_lineage_build(
    rollout: tuple[list[dict[str, Any]], dict[str, str | None]], rnd: random.Random
) -> None:
    """Shuffling a lineage snapshot's entries leaves the build byte-identical."""
    entries, parents = rollout
    stamped = stamp_lineage(entries, parents, delta=True)
    shuffled = list(stamped)
    rnd.shuffle(shuffled)
    assert encode_json(_build(shuffled)) == encode_json(_build(stamped))
