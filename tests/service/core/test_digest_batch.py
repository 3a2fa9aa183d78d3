"""Batched token digests: the same digests as one at a time, however the ids are held."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from token_finalizer.core import digest_batch
from token_finalizer.core.digest_batch import DigestBatch
from token_finalizer.core.token_digest import EMPTY_TOKEN_DIGEST, InvalidTokenIds, token_digest


def _run(*sequences: tuple[np.ndarray, ...]) -> list[str]:
    batch = DigestBatch()
    for parts in sequences:
        batch.add(*parts)
    return batch.run()


def test_views_of_one_buffer_hash_like_their_lists() -> None:
    """Prefix views of one shared buffer digest exactly as their id lists do."""
    buffer = np.arange(1000, 1100, dtype=np.int32)
    views = [buffer[:n] for n in (1, 10, 50, 100)]
    assert _run(*[(view,) for view in views]) == [token_digest(v.tolist()) for v in views]


def test_a_view_not_at_the_start_of_its_buffer() -> None:
    """A slice from the middle of a buffer digests as its own ids."""
    buffer = np.arange(50, dtype=np.int32)
    assert _run((buffer[7:30],)) == [token_digest(list(range(7, 30)))]


def test_parts_digest_as_their_concatenation() -> None:
    """A sequence given as a shared-buffer view plus its own generation is one sequence."""
    buffer = np.array([5, 6, 7, 8], dtype=np.int32)
    generation = np.array([2**64 - 1, 9], dtype=np.uint64)
    assert _run((buffer[:3], generation)) == [token_digest([5, 6, 7, 2**64 - 1, 9])]


def test_strided_and_wide_arrays_hash_exactly() -> None:
    """Non-contiguous and uint64 arrays are converted on their own, exactly."""
    wide = np.array([2**63, 1, 2**64 - 1, 3], dtype=np.uint64)
    assert _run((wide[::2],), (wide,)) == [
        token_digest([2**63, 2**64 - 1]),
        token_digest(wide.tolist()),
    ]


def test_empty_sequence_is_the_domain_digest() -> None:
    """A sequence without ids is the empty digest."""
    assert _run((np.empty(0, dtype=np.int32),)) == [EMPTY_TOKEN_DIGEST]


def test_negative_id_is_refused_when_added() -> None:
    """A negative id raises InvalidTokenIds at `add`, in NeMo Gym's words."""
    with pytest.raises(InvalidTokenIds, match="non-negative, got -4"):
        DigestBatch().add(np.array([1, -4], dtype=np.int32))


def test_threads_give_the_same_digests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hashed by the thread pool (a tiny threshold), the digests are those of one thread."""
    buffer = np.arange(20_000, dtype=np.int32)
    sequences = [(buffer[:n],) for n in range(1000, 20_000, 1000)]
    sequential = _run(*sequences)
    monkeypatch.setattr(digest_batch, "DIGEST_THREADS", 3)
    monkeypatch.setattr(digest_batch, "DIGEST_PARALLEL_MIN_BYTES", 1)
    assert _run(*sequences) == sequential == [token_digest(s[0].tolist()) for s in sequences]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=40), st.lists(st.integers(0, 40), max_size=6))
def test_any_prefixes_of_one_buffer(ids: list[int], cuts: list[int]) -> None:
    """For random ids in [0, 2**64) and random prefixes, the batch equals token_digest."""
    buffer = np.array(ids, dtype=np.uint64)
    lengths = [min(cut, len(ids)) for cut in cuts]
    assert _run(*[(buffer[:n],) for n in lengths]) == [token_digest(ids[:n]) for n in lengths]
