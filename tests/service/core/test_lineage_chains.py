"""Materialized chains and their cache: what is kept, what is shared, what is dropped."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from token_finalizer.core.lineage_chains import (
    BrokenChain,
    Chain,
    ChainCache,
    ScopedChains,
    cumulative_length,
    materialize,
    remember_committed,
)
from token_finalizer.core.lineage_index import RolloutLineage, link_of
from token_finalizer.core.lineage_resolution import MAX_DELTA_DEPTH


def _call(call_id: str, prompt: list[int], generation: list[int], parent: str | None = None) -> Any:
    return SimpleNamespace(
        model_call_id=call_id,
        prompt_token_ids=np.array(prompt, dtype=np.int32),
        generation_token_ids=np.array(generation, dtype=np.int32),
        prompt_is_delta=parent is not None,
        parent_call_id=parent,
    )


def _chain(length: int) -> Chain:
    return Chain(np.arange(length), depth=0)


def _lineage(*calls: Any) -> RolloutLineage:
    by_id = {call.model_call_id: call for call in calls}
    lineage = RolloutLineage(by_id.get)
    for call in calls:
        lineage.add(call)
    return lineage


def test_cache_evicts_the_least_recently_used_beyond_its_budget() -> None:
    """Keeping a chain that overflows the budget drops the oldest untouched ones first."""
    cache = ChainCache(max_tokens=10)
    cache.put("s", "a", _chain(4))
    cache.put("s", "b", _chain(4))
    cache.get("s", "a")
    cache.put("s", "c", _chain(4))
    assert (cache.get("s", "a"), cache.get("s", "b")) != (None, None)
    assert cache.get("s", "b") is None and cache.tokens == 8


def test_a_chain_longer_than_the_budget_is_not_kept() -> None:
    """A chain bigger than the whole budget is not cached (nor does it evict anything)."""
    cache = ChainCache(max_tokens=10)
    cache.put("s", "a", _chain(4))
    cache.put("s", "big", _chain(11))
    assert cache.get("s", "big") is None and cache.get("s", "a") is not None


def test_forget_drops_every_chain_of_one_scope_only() -> None:
    """Forgetting a scope (a retired capture) leaves other scopes' chains alone."""
    cache = ChainCache(max_tokens=100)
    cache.put("one", "a", _chain(3))
    cache.put("two", "a", _chain(3))
    cache.forget("one")
    assert cache.get("one", "a") is None and cache.get("two", "a") is not None
    assert cache.tokens == 3


def _delta_run(calls: int) -> list[Chain]:
    """The chains of a rollout of `calls` delta calls of 100 ids each, all in one buffer."""
    chains = [Chain.anchored(_call("c0", list(range(100)), []))]
    for turn in range(1, calls):
        chains.append(chains[-1].extended(_call(f"c{turn}", [turn] * 100, [], f"c{turn - 1}")))
    return chains


def test_chains_sharing_a_buffer_count_its_size_once() -> None:
    """Forty delta chains viewing one buffer cost that buffer, not the sum of their lengths."""
    chains = _delta_run(40)
    cache = ChainCache(max_tokens=100_000)
    for turn, chain in enumerate(chains):
        cache.put("s", f"c{turn}", chain)
    longest = len(chains[-1].tokens)
    assert len(cache) == 40 and longest <= cache.tokens <= 4 * longest
    assert cache.tokens < sum(len(chain.tokens) for chain in chains) // 4


def test_a_shared_buffer_is_counted_until_its_last_viewer_leaves() -> None:
    """Dropping some chains of a buffer frees nothing; dropping the last frees the buffer."""
    chains = _delta_run(3)
    cache = ChainCache(max_tokens=100_000)
    for turn, chain in enumerate(chains[1:], start=1):
        cache.put("s", f"c{turn}", chain)
    held = cache.tokens
    cache.put("other", "x", _chain(5))
    cache.forget("other")
    assert cache.tokens == held
    cache.forget("s")
    assert (cache.tokens, len(cache)) == (0, 0)


def test_recent_lists_a_scopes_chains_most_recent_first() -> None:
    """`recent` names the most recently used chains of a scope, newest first, up to a limit."""
    cache = ChainCache(max_tokens=100)
    for call_id in ("a", "b", "c"):
        cache.put("s", call_id, _chain(1))
    cache.get("s", "a")
    assert list(cache.recent("s", 2)) == ["a", "c"]


def test_a_child_appends_in_place_to_its_parents_buffer() -> None:
    """A delta extending the last chain of a buffer shares it (no copy of the prefix)."""
    parent = Chain.anchored(_call("a", [1, 2], [3])).extended(_call("b", [4], [5], "a"))
    child = parent.extended(_call("c", [6], [], "b"))
    assert child.tokens.tolist() == [1, 2, 3, 4, 5, 6]
    assert np.shares_memory(parent.tokens, child.tokens)


def test_a_second_child_branches_off_a_copy() -> None:
    """Two children of one parent each see their own continuation."""
    parent = Chain.anchored(_call("a", [1], [2])).extended(_call("b", [3], [], "a"))
    first = parent.extended(_call("c", [4], [], "b"))
    second = parent.extended(_call("d", [9], [], "b"))
    assert first.tokens.tolist() == [1, 2, 3, 4]
    assert second.tokens.tolist() == [1, 2, 3, 9]
    assert parent.tokens.tolist() == [1, 2, 3]


def test_materialize_stops_at_the_nearest_cached_ancestor() -> None:
    """A chain is rebuilt from the nearest cached chain up, not from its anchor."""
    calls = [_call("a", [1], [2]), _call("b", [3], [], "a"), _call("c", [4], [], "b")]
    lineage = _lineage(*calls)
    chains = ScopedChains(ChainCache(100), lineage.scope)
    chains.keep("b", Chain(np.array([7, 7, 7]), depth=1))
    link = lineage.link("c")
    assert link is not None
    assert materialize(link, lineage, chains).tokens.tolist() == [7, 7, 7, 4]


def test_cumulative_length_walks_links_without_tokens() -> None:
    """The length of a delta call without cum_len is summed over its chain's links."""
    lineage = _lineage(_call("a", [1, 2], [3]), _call("b", [4], [5, 6], "a"))
    link = lineage.link("b")
    assert link is not None
    assert cumulative_length(link, lineage, ScopedChains(ChainCache(100), lineage.scope)) == 6


def test_depth_counts_through_a_cached_ancestor() -> None:
    """A cached ancestor's depth counts toward the limit, as an uncached walk would."""
    lineage = _lineage(_call("d", [1], [], "deep"))
    chains = ScopedChains(ChainCache(100), lineage.scope)
    chains.keep("deep", Chain(np.array([0]), depth=MAX_DELTA_DEPTH))
    link = lineage.link("d")
    assert link is not None
    with pytest.raises(BrokenChain, match="exceeds"):
        materialize(link, lineage, chains)


def test_a_committed_full_prompt_is_remembered() -> None:
    """A just-committed full-prompt call's chain is cached without any read."""
    call = _call("a", [1, 2], [3])
    chains = ScopedChains(ChainCache(100), "s")
    remember_committed(call, link_of(call), chains)
    cached = chains.cached("a")
    assert cached is not None and cached.tokens.tolist() == [1, 2, 3] and not cached.verified


def test_a_committed_delta_is_remembered_only_after_a_cached_parent() -> None:
    """A delta is cached at commit when its parent's chain is at hand, never by reading."""
    chains = ScopedChains(ChainCache(100), "s")
    orphan = _call("b", [4], [], "a")
    remember_committed(orphan, link_of(orphan), chains)
    assert chains.cached("b") is None
    chains.keep("a", Chain(np.array([1, 2]), depth=0))
    remember_committed(orphan, link_of(orphan), chains)
    cached = chains.cached("b")
    assert cached is not None and cached.tokens.tolist() == [1, 2, 4] and cached.depth == 1


def test_chains_keep_ids_past_two_to_the_63_exact() -> None:
    """int32 prompts and uint64 generations join and extend exactly (never through floats)."""
    root = _call("c1", [1, 2], [3])
    root.generation_token_ids = np.array([2**64 - 1], dtype=np.uint64)
    child = _call("c2", [4], [2**31 - 1], parent="c1")
    anchored = Chain.anchored(root)
    extended = anchored.extended(child).extended(_call("c3", [5], [6], parent="c2"))
    assert anchored.tokens.tolist() == [1, 2, 2**64 - 1]
    assert extended.tokens.tolist() == [1, 2, 2**64 - 1, 4, 2**31 - 1, 5, 6]
