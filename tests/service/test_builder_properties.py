"""Property tests of the builder on random capture forests (hypothesis).

Forests are grown from a tiny token alphabet so that retries, forks, shared
prefixes, ambiguous parents, compactions and empty generations all occur.
The per-token-trie baseline in bench/ is an independent implementation of the
same rules and serves as the oracle.
"""

from __future__ import annotations

import random
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from bench._trie_baseline import build_response
from tests.support.captures import assert_prefix_contiguous, make_entry, snapshot_of
from token_finalizer import rebuild_snapshot
from token_finalizer.core.codec import encode_json


def _tokens(rng: random.Random, low: int, high: int) -> list[int]:
    return [rng.randrange(3) for _ in range(rng.randint(low, high))]


@st.composite
def forests(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A random capture: roots, extensions, retries and empty generations, unordered."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    entries: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 14))):
        move = rng.random()
        generation = [] if rng.random() < 0.1 else _tokens(rng, 1, 3)
        if not entries or move < 0.15:  # a new root (first call, or a compaction)
            prompt = _tokens(rng, 0, 4)
        else:
            parent = rng.choice(entries)
            if move < 0.35:  # a retry of an existing call
                prompt = list(parent["prompt_token_ids"])
            else:  # an extension: parent's sequence plus an interstitial
                prompt = (
                    parent["prompt_token_ids"] + parent["generation_token_ids"] + _tokens(rng, 0, 2)
                )
        entries.append(
            make_entry("r", f"c{i:02d}", prompt, generation, created_at=float(rng.randint(0, 5)))
        )
    return entries


def _encoded(build: dict[str, Any]) -> bytes:
    return encode_json(build)


@settings(max_examples=300, deadline=None)
@given(forests(), st.randoms(use_true_random=False))
def test_entry_order_never_changes_the_build(
    entries: list[dict[str, Any]], rnd: random.Random
) -> None:
    """Shuffling the snapshot's entries yields the identical build."""
    shuffled = list(entries)
    rnd.shuffle(shuffled)
    assert _encoded(rebuild_snapshot(snapshot_of(entries)).to_dict()) == _encoded(
        rebuild_snapshot(snapshot_of(shuffled)).to_dict()
    )


@settings(max_examples=300, deadline=None)
@given(forests())
def test_successful_builds_are_contiguous_and_masked_by_the_rule(
    entries: list[dict[str, Any]],
) -> None:
    """A build never raises; a success is contiguous and masked exactly when the chain rules say."""
    build = rebuild_snapshot(snapshot_of(entries)).to_dict()
    if build["rebuilt_response"] is None:
        assert build["mask_sample"] is True and build["error"]
        return
    assert_prefix_contiguous(build["rebuilt_response"]["output"])
    metrics = build["metrics"]
    expected = bool(build["unresolved_retries"]) or metrics["roots"] != 1 or metrics["chains"] != 1
    assert build["mask_sample"] is expected


@settings(max_examples=300, deadline=None)
@given(forests())
def test_build_agrees_with_the_per_token_trie_baseline(entries: list[dict[str, Any]]) -> None:
    """The rebuilt response equals the independent trie implementation's, or both find no chain."""
    build = rebuild_snapshot(snapshot_of(entries), model="m").to_dict()
    try:
        expected = build_response(entries, "r", "m")
    except ValueError:
        assert build["rebuilt_response"] is None
        return
    assert build["rebuilt_response"] is not None, build["error"]
    assert _encoded(build["rebuilt_response"]) == orjson.dumps(expected)


@settings(max_examples=300, deadline=None)
@given(forests())
def test_seed_build_with_attribution_off_follows_the_chain_rules_alone(
    entries: list[dict[str, Any]],
) -> None:
    """With attribution off a seed snapshot builds, and masks, by the chain rules alone."""
    snapshot = snapshot_of(entries)
    off = rebuild_snapshot(snapshot, model="m", terminal_attribution=False).to_dict()
    unattributed = rebuild_snapshot(snapshot, model="m", record={}).to_dict()
    assert off["metrics"].pop("terminal_attribution")["reason"] == "disabled"
    unattributed["metrics"].pop("terminal_attribution")
    assert _encoded(off) == _encoded(unattributed)
