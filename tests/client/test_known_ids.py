"""The resolver's known ids: each rollout's last match, kept under a budget of ids (LRU)."""

from __future__ import annotations

import pytest

from token_finalizer_client._known_ids import KnownIdsCache

DIGEST = "a" * 64


def test_kept_ids_are_named_by_their_digest_and_length() -> None:
    """What is kept goes on the wire as {digest, length}."""
    cache = KnownIdsCache(budget=10)
    cache.keep("r1", DIGEST, (1, 2, 3))
    known = cache.get("r1")
    assert known is not None and known.to_wire() == {"digest": DIGEST, "length": 3}


def test_a_new_match_replaces_the_rollouts_earlier_one() -> None:
    """One entry per rollout; the budget counts only the latest."""
    cache = KnownIdsCache(budget=10)
    cache.keep("r1", DIGEST, (1, 2, 3))
    cache.keep("r1", "b" * 64, (1, 2, 3, 4))
    known = cache.get("r1")
    assert known is not None and (known.digest, cache.size, len(cache)) == ("b" * 64, 4, 1)


def test_the_least_recently_resolved_rollout_goes_first() -> None:
    """Past the budget, the rollout not resolved for the longest is dropped."""
    cache = KnownIdsCache(budget=6)
    cache.keep("r1", DIGEST, (1, 2, 3))
    cache.keep("r2", DIGEST, (4, 5))
    cache.get("r1")  # r1 is now the most recent
    cache.keep("r3", DIGEST, (6, 7))
    assert (cache.get("r2"), cache.get("r1") is not None, cache.size) == (None, True, 5)


@pytest.mark.parametrize(
    ("digest", "ids"),
    [(DIGEST, ()), ("d", (1,)), ("A" * 64, (1,)), (DIGEST, tuple(range(11)))],
    ids=["empty", "short-digest", "uppercase-digest", "over-budget"],
)
def test_what_a_store_could_not_use_is_not_kept(digest: str, ids: tuple[int, ...]) -> None:
    """Empty ids, a digest a store would refuse, or more ids than the budget: nothing kept."""
    cache = KnownIdsCache(budget=10)
    cache.keep("r1", DIGEST, (9,))
    cache.keep("r1", digest, ids)
    assert (cache.get("r1"), cache.size) == (None, 0)


def test_a_negative_budget_is_refused() -> None:
    """The budget is a count of ids."""
    with pytest.raises(ValueError, match="budget"):
        KnownIdsCache(budget=-1)
