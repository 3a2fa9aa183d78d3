"""The token id dtype rule: int32 when every id fits, else uint64; arrays combined exactly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from token_finalizer.core.errors import TokenIdOutOfRange
from token_finalizer.core.token_ids import (
    NARROW,
    WIDE,
    check_token_id_list,
    common_dtype,
    join_ids,
    narrowest,
    same_ids,
    token_id_array,
    widened,
)

ANY_ID = st.integers(0, 2**64 - 1)
ID_LISTS = st.lists(st.one_of(st.integers(0, 300), ANY_ID), max_size=20)


def test_small_ids_are_int32() -> None:
    """A list of ids below 2**31 becomes an int32 array."""
    assert check_token_id_list([0, 7, 2**31 - 1]).dtype == NARROW


def test_one_wide_id_makes_the_array_uint64() -> None:
    """An id of 2**31 or more makes the whole array uint64, every id exact."""
    array = check_token_id_list([1, 2**63 + 5, 2**64 - 1])
    assert array.dtype == WIDE and array.tolist() == [1, 2**63 + 5, 2**64 - 1]


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([1, -3], "token ids must be non-negative, got -3"),
        ([1, 2**64], f"token ids must be below 2**64, got {2**64}"),
        ([2**64, -1], "token ids must be non-negative, got -1"),
    ],
)
def test_out_of_range_ids_are_refused_with_the_digest_words(ids: list[int], message: str) -> None:
    """Negative ids and ids of 2**64 or more raise TokenIdOutOfRange in NeMo Gym's words."""
    with pytest.raises(TokenIdOutOfRange, match=f"^{message.replace('*', '[*]')}$"):
        check_token_id_list(ids)


@pytest.mark.parametrize("stranger", [1.7, 2.0, "12", True, None, [1]])
def test_non_integers_are_refused_not_converted(stranger: object) -> None:
    """Floats, strings, booleans, null and lists in an id list raise TypeError."""
    with pytest.raises(TypeError):
        check_token_id_list([1, stranger])


def test_int64_array_is_narrowed_when_it_fits() -> None:
    """An int64 array of small ids becomes int32; of wide ids, uint64."""
    assert narrowest(np.array([1, 2], dtype=np.int64)).dtype == NARROW
    assert narrowest(np.array([1, 2**40], dtype=np.int64)).dtype == WIDE


def test_negative_id_in_a_signed_array_is_refused() -> None:
    """A negative id in an int64 or int32 array raises instead of wrapping to a huge id."""
    for dtype in (np.int64, np.int32):
        with pytest.raises(TokenIdOutOfRange, match="non-negative, got -1"):
            token_id_array(np.array([5, -1], dtype=dtype))


def test_widening_a_negative_id_is_refused() -> None:
    """widened() refuses a negative id rather than casting it to 2**64 - 1."""
    with pytest.raises(TokenIdOutOfRange):
        widened(np.array([-1], dtype=np.int64))


def test_boolean_arrays_are_not_ids() -> None:
    """A boolean array is refused as token ids."""
    with pytest.raises(TypeError):
        token_id_array(np.array([True, False]))


def test_common_dtype_ignores_empty_arrays() -> None:
    """An empty uint64 array does not widen int32 company; a non-empty one does."""
    narrow = np.array([1], dtype=NARROW)
    assert common_dtype([narrow, np.empty(0, dtype=WIDE)]) == NARROW
    assert common_dtype([narrow, np.array([1], dtype=WIDE)]) == WIDE


def test_join_of_int32_and_uint64_stays_exact() -> None:
    """Joining int32 and uint64 parts gives exact uint64 (numpy alone would give floats)."""
    joined = join_ids([np.array([1, 2], dtype=NARROW), np.array([2**63 + 5], dtype=WIDE)])
    assert joined.dtype == WIDE and joined.tolist() == [1, 2, 2**63 + 5]


def test_same_ids_across_signedness_is_exact() -> None:
    """Arrays that differ only beyond float precision are told apart across int64 and uint64."""
    signed = np.array([2**53 + 1], dtype=np.int64)
    assert not same_ids(signed, np.array([2**53], dtype=WIDE))
    assert same_ids(signed, np.array([2**53 + 1], dtype=WIDE))


@settings(max_examples=300, deadline=None)
@given(st.lists(ID_LISTS, max_size=5))
def test_join_equals_python_concatenation(parts: list[list[int]]) -> None:
    """For any ids in [0, 2**64), joining their arrays equals concatenating the lists."""
    arrays = [check_token_id_list(part) for part in parts]
    assert join_ids(arrays).tolist() == [token for part in parts for token in part]


@settings(max_examples=300, deadline=None)
@given(ID_LISTS, ID_LISTS)
def test_same_ids_equals_list_equality(first: list[int], second: list[int]) -> None:
    """For any ids in [0, 2**64), same_ids agrees with list equality, whatever the dtypes."""
    assert same_ids(check_token_id_list(first), check_token_id_list(second)) == (first == second)
