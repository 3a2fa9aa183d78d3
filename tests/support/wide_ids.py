"""Captures whose token ids reach the top of the valid range [0, 2**64), mixed with small ones.

numpy holds such ids only as uint64, and promotes uint64 mixed with int32 or
int64 to float64: these captures show whether every path keeps them exact.
"""

from __future__ import annotations

from typing import Any

from tests.support.captures import make_entry
from tests.support.lineage import stamp_lineage

__all__ = ["WIDE_IDS", "cumulative", "expected_items", "token_items", "wide_rollout"]

WIDE_IDS = (2**63, 2**63 + 5, 2**64 - 1)
_TOP = 2**64 - 1


def wide_rollout(rollout_id: str, *, lineage: bool = False, delta: bool = False) -> list[dict]:
    """Three chained calls whose prompts and generations mix ids near 2**64 with small ones.

    `lineage`: stamped as a NeMo Gym 0.7 writer stamps them (digests checked
    by the build); `delta` stores each resolved prompt as its suffix.
    """
    first_prompt = [1, 2**63, 7]
    first_generation = [2**63 + 5, 11]
    second_prompt = [*first_prompt, *first_generation, _TOP, 3]
    second_generation = [5, 2**63]
    third_prompt = [*second_prompt, *second_generation, 9]
    entries = [
        make_entry(rollout_id, "c0", first_prompt, first_generation, created_at=1.0),
        make_entry(rollout_id, "c1", second_prompt, second_generation, created_at=2.0),
        make_entry(rollout_id, "c2", third_prompt, [_TOP], created_at=3.0),
    ]
    if not lineage:
        return entries
    return stamp_lineage(entries, {"c0": None, "c1": "c0", "c2": "c1"}, delta=delta)


def cumulative(rollout_id: str) -> list[int]:
    """The final cumulative sequence of `wide_rollout` (its last prompt + generation)."""
    last = wide_rollout(rollout_id)[-1]
    return [*last["prompt_token_ids"], *last["generation_token_ids"]]


def _exact_ids(ids: Any) -> list[int]:
    """Plain ints of a token list or integer array; AssertionError for anything else (a float
    2**63 equals the int 2**63 in Python, so `==` alone would not notice a lossy path)."""
    if isinstance(ids, list):
        assert all(type(token) is int for token in ids), f"not all ints: {ids!r}"
        return ids
    assert ids.dtype.kind in "iu", f"token array of dtype {ids.dtype}"
    plain: list[int] = ids.tolist()
    return plain


def token_items(record: dict[str, Any]) -> list[tuple[list[int], list[int]]]:
    """(prompt, generation) of every token-bearing output item, checked to be exact ints."""
    return [
        (_exact_ids(item["prompt_token_ids"]), _exact_ids(item["generation_token_ids"]))
        for item in record["response"]["output"]
        if "generation_token_ids" in item
    ]


def expected_items(rollout_id: str) -> list[tuple[list[int], list[int]]]:
    """What `token_items` must give for a finalized `wide_rollout`: every call, full prompts."""
    return [
        (entry["prompt_token_ids"], entry["generation_token_ids"])
        for entry in wide_rollout(rollout_id)
    ]
