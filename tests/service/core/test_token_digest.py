"""Token digest v1, checked against NeMo Gym 0.7.0 vectors."""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import numpy as np
import pytest

from tests.support.vectors import case_ids, load_vectors
from token_finalizer.core.token_digest import (
    EMPTY_TOKEN_DIGEST,
    TOKEN_DIGEST_VERSION,
    token_digest,
    token_digest_of_parts,
)

VECTORS = load_vectors("token_digests.json")["cases"]
SEQUENCES = [case for case in VECTORS if "ids" in case and "expected" in case]
PARTS = [case for case in VECTORS if "parts" in case]
ERRORS = [case for case in VECTORS if "error" in case]


def _struct_digest(ids: list[int]) -> str:
    """The documented digest formula spelled out with struct, for comparison."""
    if not ids:
        return hashlib.sha256(b"nemo-gym-tokens").hexdigest()
    body = struct.pack(">BQ", 1, len(ids)) + struct.pack(f">{len(ids)}Q", *ids)
    return hashlib.sha256(b"nemo-gym-tokens" + body).hexdigest()


@pytest.mark.parametrize("case", SEQUENCES, ids=case_ids(SEQUENCES))
def test_list_digest_matches_reference(case: dict[str, Any]) -> None:
    """A list of ints hashes to the reference digest."""
    assert token_digest(case["ids"]) == case["expected"]


@pytest.mark.parametrize("case", SEQUENCES, ids=case_ids(SEQUENCES))
def test_uint64_array_digest_matches_reference(case: dict[str, Any]) -> None:
    """A uint64 array of the same ids hashes to the same reference digest."""
    assert token_digest(np.array(case["ids"], dtype=np.uint64)) == case["expected"]


@pytest.mark.parametrize("case", PARTS, ids=case_ids(PARTS))
def test_parts_digest_matches_reference_of_concatenation(case: dict[str, Any]) -> None:
    """Hashing parts equals the reference digest of their concatenation."""
    parts = [np.array(part, dtype=np.int32) for part in case["parts"]]
    assert token_digest_of_parts(*parts) == case["expected"]


@pytest.mark.parametrize("case", ERRORS, ids=case_ids(ERRORS))
def test_out_of_range_ids_fail_with_the_design_message(case: dict[str, Any]) -> None:
    """Out-of-range ids raise ValueError naming the first offending id."""
    message = case["error"].removeprefix("ValueError: ")
    with pytest.raises(ValueError, match=f"^{message.replace('*', '[*]')}$"):
        token_digest(case["ids"])


def test_version_is_one() -> None:
    """The digest layout version stamped in the header is 1."""
    assert TOKEN_DIGEST_VERSION == 1


def test_empty_sequence_hashes_the_domain_alone() -> None:
    """The empty sequence's digest is SHA-256 of the domain bytes, without a header."""
    assert token_digest([]) == hashlib.sha256(b"nemo-gym-tokens").hexdigest() == EMPTY_TOKEN_DIGEST


def test_empty_float_array_is_the_empty_sequence() -> None:
    """An empty array of any dtype (np.asarray([]) is float) is the empty sequence."""
    assert token_digest(np.asarray([])) == EMPTY_TOKEN_DIGEST


def test_digest_does_not_depend_on_integer_dtype() -> None:
    """int32, int64 and uint64 arrays of the same ids hash the same."""
    ids = [0, 1, 151_643, 2**31 - 1]
    digests = {
        token_digest(np.array(ids, dtype=dtype)) for dtype in (np.int32, np.int64, np.uint64)
    }
    assert digests == {_struct_digest(ids)}


def test_large_array_matches_struct_encoding() -> None:
    """A long random array hashes exactly like the per-id struct encoding."""
    ids = np.random.default_rng(7).integers(0, 2**31, size=50_000, dtype=np.int64)
    assert token_digest(ids) == _struct_digest(ids.tolist())


def test_parts_equal_concatenation_for_random_splits() -> None:
    """Splitting a sequence into parts anywhere never changes its digest."""
    rng = np.random.default_rng(11)
    ids = rng.integers(0, 200_000, size=1_000, dtype=np.int32)
    whole = token_digest(ids)
    for _ in range(20):
        cuts = np.sort(rng.integers(0, ids.size + 1, size=3))
        assert token_digest_of_parts(*np.split(ids, cuts)) == whole


def test_id_of_two_to_the_64_is_refused() -> None:
    """2**64 raises ValueError instead of hanging or overflowing."""
    with pytest.raises(
        ValueError, match=r"^token ids must be below 2\*\*64, got 18446744073709551616$"
    ):
        token_digest([5, 2**64])


def test_huge_python_int_is_refused_without_overflow() -> None:
    """An int far beyond int64 is reported as a ValueError, not an OverflowError."""
    with pytest.raises(ValueError, match=r"below 2\*\*64, got 1180591620717411303424$"):
        token_digest([1, 2**70])


def test_object_array_beyond_uint64_is_refused() -> None:
    """A numpy object array holding 2**64 is refused like a list."""
    with pytest.raises(ValueError, match=r"below 2\*\*64"):
        token_digest(np.array([1, 2**64], dtype=object))


def test_negative_id_in_int32_array_is_named() -> None:
    """The first negative id of a signed array is named in the error."""
    with pytest.raises(ValueError, match=r"^token ids must be non-negative, got -7$"):
        token_digest(np.array([3, -7, -1], dtype=np.int32))


def test_first_offender_across_parts_is_named() -> None:
    """With several parts, the error names the first offending id in concatenation order."""
    with pytest.raises(ValueError, match=r"non-negative, got -2$"):
        token_digest_of_parts([1, 2], [-2, 2**64])


def test_negative_mixed_with_ids_above_int64_is_named() -> None:
    """A list numpy would turn into floats still reports the exact negative id."""
    with pytest.raises(ValueError, match=r"non-negative, got -3$"):
        token_digest([7, -3, 2**63])


def test_ids_above_int64_hash_exactly() -> None:
    """Ids in [2**63, 2**64) hash exactly, from a list or a uint64 array."""
    ids = [2**63, 2**64 - 1, 0]
    assert token_digest(ids) == token_digest(np.array(ids, dtype=np.uint64)) == _struct_digest(ids)


def test_float_ids_are_refused() -> None:
    """Non-integer ids are a TypeError, never silently truncated."""
    with pytest.raises(TypeError, match="integers"):
        token_digest([1, 2.5])  # type: ignore[list-item]  # a wrong type on purpose


def test_float_array_is_refused() -> None:
    """A non-empty float array is a TypeError."""
    with pytest.raises(TypeError, match="dtype float64"):
        token_digest(np.array([1.0, 2.0]))


def test_two_dimensional_array_is_refused() -> None:
    """Token ids must be one-dimensional."""
    with pytest.raises(ValueError, match="one-dimensional"):
        token_digest(np.zeros((2, 2), dtype=np.int32))
