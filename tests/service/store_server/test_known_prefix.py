"""The store server's answered ids: a known prefix in the same buffer is taken without hashing."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

from token_finalizer.core.token_digest import token_digest
from token_finalizer.store_server import _known_prefix
from token_finalizer.store_server._known_prefix import AnsweredIds
from token_finalizer.store_server._requests import KnownPrefix

BUFFER = np.arange(1000, dtype=np.uint64)


@pytest.fixture
def no_hashing(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """token_digest replaced by a counter that fails: any hash is seen (and wrong)."""
    calls: list[int] = []

    def counted(ids: Any) -> str:
        calls.append(len(ids))
        return "0" * 64

    monkeypatch.setattr(_known_prefix, "token_digest", counted)
    return calls


def test_a_prefix_answered_from_the_same_buffer_is_not_hashed(no_hashing: list[int]) -> None:
    """The earlier answer's ids lead the new match's in the same memory: taken as they are."""
    answered, earlier, now = AnsweredIds(), BUFFER[:400], BUFFER[:500]
    answered.remember("r1", "d" * 64, earlier)
    assert answered.known_length("r1", now, KnownPrefix(400, "d" * 64)) == 400
    assert no_hashing == []


def test_ids_in_another_buffer_are_hashed() -> None:
    """Equal ids elsewhere in memory prove nothing by place: their digest decides."""
    answered, earlier = AnsweredIds(), BUFFER[:400]
    answered.remember("r1", token_digest(earlier), earlier)
    copy = BUFFER[:500].copy()
    assert answered.known_length("r1", copy, KnownPrefix(400, token_digest(earlier))) == 400
    assert answered.known_length("r1", copy, KnownPrefix(400, "e" * 64)) is None


def test_a_prefix_of_another_rollout_or_length_is_hashed(no_hashing: list[int]) -> None:
    """Held ids count only for their own rollout and their own length."""
    answered = AnsweredIds()
    answered.remember("r1", "d" * 64, BUFFER[:400])
    assert answered.known_length("r2", BUFFER[:500], KnownPrefix(400, "d" * 64)) is None
    assert answered.known_length("r1", BUFFER[:500], KnownPrefix(300, "d" * 64)) is None
    assert no_hashing == [400, 300]


def test_ids_no_longer_held_elsewhere_are_hashed(no_hashing: list[int]) -> None:
    """The answered ids are held weakly: once gone, the prefix is hashed again."""
    answered = AnsweredIds()
    answered.remember("r1", "d" * 64, BUFFER[:400])  # this view dies at once
    gc.collect()
    assert answered.known_length("r1", BUFFER[:500], KnownPrefix(400, "d" * 64)) is None
    assert no_hashing == [400]


def test_the_oldest_answers_go_first_past_the_capacity(no_hashing: list[int]) -> None:
    """At most `capacity` answers are remembered, the least recently answered dropped."""
    answered, first, second = AnsweredIds(capacity=1), BUFFER[:100], BUFFER[:200]
    answered.remember("r1", "a" * 64, first)
    answered.remember("r2", "b" * 64, second)
    assert answered.known_length("r1", BUFFER[:300], KnownPrefix(100, "a" * 64)) is None
    assert answered.known_length("r2", BUFFER[:300], KnownPrefix(200, "b" * 64)) == 200


def test_no_known_prefix_or_a_longer_one_counts_nothing() -> None:
    """Without `known`, or naming more ids than the match holds: no offset."""
    answered = AnsweredIds()
    assert answered.known_length("r1", BUFFER[:10], None) is None
    assert answered.known_length("r1", BUFFER[:10], KnownPrefix(11, "a" * 64)) is None
