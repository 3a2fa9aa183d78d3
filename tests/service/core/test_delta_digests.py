"""Delta prompts checked against their recorded digests, all at once after rebuilding.

The digests of a delta capture are hashed as one batch once every chain is
rebuilt; a wrong digest must still break exactly its own entry and the delta
entries rebuilt on top of it, as a walk that stopped there would.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.captures import make_entry
from tests.support.lineage import stamp_lineage
from token_finalizer.core.delta import materialize
from token_finalizer.core.entries import TokenEntry

_WRONG = "0" * 64


def _broken(entries: list[dict[str, Any]]) -> list[str]:
    return materialize([TokenEntry.from_dict(entry) for entry in entries]).broken


def test_a_wrong_digest_breaks_its_entry_and_what_was_built_on_it() -> None:
    """c2's wrong digest breaks c2, c3, c4 (snapshot order); the branch b2, b3 off c1 stays."""
    context, entries, parents = [1, 2], [], {}
    for call, parent in (("c0", None), ("c1", "c0"), ("c2", "c1"), ("c3", "c2"), ("c4", "c3")):
        entries.append(make_entry("r", call, context, [len(entries) + 10]))
        parents[call] = parent
        context = [*context, len(entries) + 9, 7]
    c1 = entries[1]
    branch = [*c1["prompt_token_ids"], *c1["generation_token_ids"], 99]
    entries.append(make_entry("r", "b2", branch, [50]))
    entries.append(make_entry("r", "b3", [*branch, 50, 98], [51]))
    parents.update(b2="c1", b3="b2")
    stamped = stamp_lineage(entries, parents, delta=True)
    stamped[2]["digest"] = _WRONG
    random.Random(3).shuffle(stamped)
    expected = [e["model_call_id"] for e in stamped if e["model_call_id"] in {"c2", "c3", "c4"}]
    assert _broken(stamped) == expected


@st.composite
def corrupted_rollouts(draw: st.DrawFn) -> tuple[list[dict[str, Any]], set[str]]:
    """A random delta capture (a tree) with one delta entry's digest made wrong, and the ids
    a walk stopping at that entry breaks: it and every delta entry below it."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    entries: list[dict[str, Any]] = [make_entry("r", "c00", [1, 2], [3])]
    parents: dict[str, str | None] = {"c00": None}
    for i in range(1, draw(st.integers(2, 14))):
        parent = rng.choice(entries)
        prompt = [*parent["prompt_token_ids"], *parent["generation_token_ids"], rng.randrange(9)]
        entries.append(make_entry("r", f"c{i:02d}", prompt, [rng.randrange(9)]))
        parents[f"c{i:02d}"] = parent["model_call_id"]
    stamped = stamp_lineage(entries, parents, delta=True)
    victim = rng.choice(stamped[1:])
    victim["digest"] = _WRONG
    below = {victim["model_call_id"]}
    for entry in stamped:  # parents come first: one pass collects every descendant
        if parents[entry["model_call_id"]] in below:
            below.add(entry["model_call_id"])
    rng.shuffle(stamped)
    return stamped, below


@settings(max_examples=200, deadline=None)
@given(corrupted_rollouts())
def test_a_wrong_digest_breaks_exactly_its_subtree(
    rollout: tuple[list[dict[str, Any]], set[str]],
) -> None:
    """For random trees, the broken entries are the corrupted one and its descendants."""
    stamped, below = rollout
    broken = _broken(stamped)
    assert set(broken) == below
    assert broken == [e["model_call_id"] for e in stamped if e["model_call_id"] in below]
