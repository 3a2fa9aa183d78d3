"""The staging hashes, checked against NeMo Gym 0.7.0's golden vectors and computed values."""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.staging_core_vectors import case_ids, load_core_vectors
from token_finalizer.core.staging import (
    EMPTY_EXTRAS_DIGEST,
    hash_chain,
    hash_extras,
    hash_staged_call,
    hash_token_parts,
    hash_tokens,
    staging_key,
)

GOLDEN = load_core_vectors("golden_vectors.json")
VECTORS = load_core_vectors("core_digests.json")
TOKENS = VECTORS["token_hashes"]
CHAINS = VECTORS["chain_hashes"]
EXTRAS = [case for case in VECTORS["extras_digests"] if "expected" in case]
EXTRAS_ERRORS = [case for case in VECTORS["extras_digests"] if "error" in case]
STAGED = [case for case in VECTORS["staging_digests"] if "expected" in case]
STAGED_ERRORS = [case for case in VECTORS["staging_digests"] if "error" in case]

ids_strategy = st.lists(st.integers(min_value=0, max_value=2**64 - 1), max_size=40)


def test_golden_extras_digest() -> None:
    """The golden extras hash to the golden extras digest."""
    assert hash_extras(GOLDEN["extras"]) == GOLDEN["extras_digest"]


def test_golden_staged_call_digest() -> None:
    """The golden staged call hashes to the golden digest."""
    assert hash_staged_call(**GOLDEN["staged_call"]) == GOLDEN["staged_call_digest"]


def test_golden_preimage_spelled_out() -> None:
    """The documented preimage of the golden staged call hashes to the golden digest."""
    call = GOLDEN["staged_call"]

    def text(value: str) -> bytes:
        return struct.pack(">Q", len(value.encode())) + value.encode()

    def block(body: bytes) -> bytes:
        return struct.pack(">Q", len(body)) + body

    ids = struct.pack(">Q", 2) + struct.pack(">2Q", 10, 11)
    mask = struct.pack(">Q", 2) + struct.pack(">2f", 0.0, 1.0)
    log_probs = struct.pack(">Q", 2) + struct.pack(">2f", 0.0, -0.25)
    preimage = (
        b"nemo-gym-staging-call-v2\x02\x02\x01"
        + text("rollout-1")
        + text("call-1")
        + b"\x01"
        + text("parent-1")
        + text("token_in")
        + struct.pack(">4Q", 3, 2, 5, 7)
        + block(ids)
        + block(mask)
        + block(log_probs)
        + bytes.fromhex(call["extras_digest"])
        + b"\x01"
        + bytes.fromhex(call["chain_hash"])
        + b"\x01"
        + bytes.fromhex(call["cumulative_hash"])
    )
    assert hashlib.sha256(preimage).hexdigest() == GOLDEN["staged_call_digest"]


def test_section_3_extras_encoding() -> None:
    """The worked extras example encodes as documented (tags, counts, sorted keys)."""

    def u64(value: int) -> bytes:
        return struct.pack(">Q", value)

    def integer(value: int) -> bytes:
        return b"I" + struct.pack(">q", value)

    encoding = (
        b"\x01D"
        + u64(1)
        + u64(14)
        + b"routed_experts"
        + b"L"
        + u64(2)
        + b"L"
        + u64(1)
        + b"L"
        + u64(2)
        + integer(1)
        + integer(2)
        + b"L"
        + u64(1)
        + b"L"
        + u64(2)
        + integer(3)
        + integer(4)
    )
    expected = hashlib.sha256(b"nemo-gym-staging-extras-v1" + encoding).hexdigest()
    assert expected == hash_extras(GOLDEN["extras"]) == GOLDEN["extras_digest"]


def test_section_3_chain_example() -> None:
    """Root [1,2,3,101,102] and child [11,12,103] give the documented chain and token hashes."""
    root = hash_chain(None, [1, 2, 3, 101, 102])
    child = hash_chain(root, [11, 12, 103])
    cumulative = hash_tokens([1, 2, 3, 101, 102, 11, 12, 103])
    assert (root[:8], root[-4:]) == ("bdad9dc5", "3112")
    assert (child[:8], child[-4:]) == ("4b135e46", "4eb8")
    assert (cumulative[:8], cumulative[-4:]) == ("0b580191", "0194")


def test_empty_extras_digest_is_not_the_empty_mapping() -> None:
    """None and {} hash differently, with the documented prefixes."""
    assert hash_extras(None) == EMPTY_EXTRAS_DIGEST
    assert EMPTY_EXTRAS_DIGEST.startswith("a1edc33c") and EMPTY_EXTRAS_DIGEST.endswith("68b6")
    assert hash_extras({}).startswith("1fd859b2") and hash_extras({}).endswith("2e77")


@pytest.mark.parametrize("case", TOKENS, ids=case_ids(TOKENS))
def test_token_hash_matches_reference(case: dict[str, Any]) -> None:
    """A list of ids hashes to the reference's token hash."""
    assert hash_tokens(case["ids"]) == case["expected"]


@pytest.mark.parametrize("case", TOKENS, ids=case_ids(TOKENS))
def test_token_hash_of_uint64_array_matches_reference(case: dict[str, Any]) -> None:
    """A native uint64 array of the same ids hashes the same."""
    assert hash_tokens(np.array(case["ids"], dtype=np.uint64)) == case["expected"]


@pytest.mark.parametrize("case", CHAINS, ids=case_ids(CHAINS))
def test_chain_hash_matches_reference(case: dict[str, Any]) -> None:
    """A delta chained onto a parent hash matches the reference."""
    assert hash_chain(case["parent"], case["delta"]) == case["expected"]


@pytest.mark.parametrize("case", EXTRAS, ids=case_ids(EXTRAS))
def test_extras_digest_matches_reference(case: dict[str, Any]) -> None:
    """Extras hash to the reference's extras digest."""
    assert hash_extras(case["extras"]) == case["expected"]


@pytest.mark.parametrize("case", EXTRAS_ERRORS, ids=case_ids(EXTRAS_ERRORS))
def test_extras_digest_refuses_what_the_reference_refuses(case: dict[str, Any]) -> None:
    """Extras the reference cannot encode raise the same exception class."""
    with pytest.raises(ValueError if case["error"] == "ValueError" else TypeError):
        hash_extras(case["extras"])


@pytest.mark.parametrize(
    "extras",
    [{"x": (1, 2)}, {"x": b"raw"}, {"x": np.int64(1)}, {1: "key"}, [("a", 1)]],
    ids=["tuple", "bytes", "numpy_scalar", "int_key", "not_a_mapping"],
)
def test_extras_digest_refuses_non_json_types(extras: Any) -> None:
    """Tuples, bytes, numpy scalars, non-string keys and non-mappings raise TypeError."""
    with pytest.raises(TypeError):
        hash_extras(extras)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_extras_digest_refuses_non_finite_floats(value: float) -> None:
    """NaN and infinities cannot be encoded."""
    with pytest.raises(ValueError, match="finite"):
        hash_extras({"x": value})


@pytest.mark.parametrize("case", STAGED, ids=case_ids(STAGED))
def test_staging_digest_matches_reference(case: dict[str, Any]) -> None:
    """Staged call fields hash to the reference's staging digest."""
    assert hash_staged_call(**case["fields"]) == case["expected"]


@pytest.mark.parametrize("case", STAGED, ids=case_ids(STAGED))
def test_staging_digest_of_arrays_matches_reference(case: dict[str, Any]) -> None:
    """The array forms typed records hold hash like the lists."""
    fields = dict(case["fields"])
    fields["token_ids_delta"] = np.array(fields["token_ids_delta"], dtype=">u8")
    for name in ("token_mask_delta", "generation_log_probs_delta"):
        fields[name] = np.array(fields[name], dtype=np.float64)
    assert hash_staged_call(**fields) == case["expected"]


@pytest.mark.parametrize("case", STAGED_ERRORS, ids=case_ids(STAGED_ERRORS))
def test_staging_digest_refuses_what_the_reference_refuses(case: dict[str, Any]) -> None:
    """Broken preconditions raise ValueError, as in the reference."""
    with pytest.raises(ValueError, match=r"\w"):
        hash_staged_call(**case["fields"])


@pytest.mark.parametrize(
    ("field", "value"),
    [("schema_version", 1), ("digest_version", True), ("extras_digest_version", 2)],
)
def test_staging_digest_refuses_other_versions(field: str, value: Any) -> None:
    """Any version but the current ones is refused."""
    with pytest.raises(ValueError, match="unsupported"):
        hash_staged_call(**{**GOLDEN["staged_call"], field: value})


@pytest.mark.parametrize(
    "ids",
    [[-1], [2**64], [True, 1], [1.0], ["1"], np.array([1.5]), np.array([[1]])],
    ids=["negative", "too_large", "bool", "float", "string", "float_array", "two_dimensional"],
)
def test_token_hash_refuses_non_token_ids(ids: Any) -> None:
    """Only exact integers in [0, 2**64) are token ids."""
    with pytest.raises(ValueError, match=r"must|token ids"):
        hash_tokens(ids)


def test_token_hash_refuses_negative_in_signed_array() -> None:
    """A signed array holding a negative id is refused, naming it."""
    with pytest.raises(ValueError, match="-3"):
        hash_tokens(np.array([1, -3], dtype=np.int64))


def test_chain_hash_refuses_a_malformed_parent_hash() -> None:
    """The parent chain hash must be lowercase hex SHA-256."""
    with pytest.raises(ValueError, match="parent_chain_hash"):
        hash_chain("AB" * 32, [1])


def test_staging_key_joins_ids() -> None:
    """The default staging key is rollout_id/model_call_id."""
    assert staging_key("r", "c") == "r/c"


def test_staging_key_refuses_empty_ids() -> None:
    """Both ids must be non-empty."""
    with pytest.raises(ValueError, match="non-empty"):
        staging_key("r", "")


@given(parts=st.lists(ids_strategy, max_size=5))
def test_token_hash_of_parts_equals_hash_of_concatenation(parts: list[list[int]]) -> None:
    """Hashing parts equals hashing their concatenation."""
    assert hash_token_parts(parts) == hash_tokens([token for part in parts for token in part])


@given(ids=ids_strategy.filter(lambda ids: ids != ids[::-1]))
def test_token_hash_is_order_sensitive(ids: list[int]) -> None:
    """Reversing a sequence that is not a palindrome changes its hash."""
    assert hash_tokens(ids) != hash_tokens(ids[::-1])


@given(ids=ids_strategy)
def test_root_and_child_chain_encodings_differ(ids: list[int]) -> None:
    """A root delta never hashes like the same delta chained onto a parent."""
    assert hash_chain(None, ids) != hash_chain("0" * 64, ids)


@given(
    mapping=st.dictionaries(
        st.text(max_size=5), st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=6
    )
)
def test_extras_digest_ignores_key_insertion_order(mapping: dict[str, int]) -> None:
    """Keys are sorted by their UTF-8 bytes, so insertion order does not matter."""
    reordered = dict(reversed(list(mapping.items())))
    assert hash_extras(mapping) == hash_extras(reordered)


@given(
    values=st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), min_size=16, max_size=60)
)
def test_long_int_lists_encode_element_by_element(values: list[int]) -> None:
    """The one-pass encoding of a long int list equals the documented per-element encoding."""
    body = b"".join(b"I" + struct.pack(">q", value) for value in values)
    encoding = b"\x01D" + struct.pack(">QQ", 1, 1) + b"xL" + struct.pack(">Q", len(values)) + body
    expected = hashlib.sha256(b"nemo-gym-staging-extras-v1" + encoding).hexdigest()
    assert hash_extras({"x": values}) == expected


@given(lp=st.floats(min_value=-1e30, max_value=0.0, allow_nan=False))
def test_staging_digest_binds_log_probs_at_float32(lp: float) -> None:
    """Log probabilities that round to the same float32 give the same digest."""
    rounded = float(np.float32(lp))
    base = {**GOLDEN["staged_call"], "generation_log_probs_delta": [0.0, lp]}
    same = {**GOLDEN["staged_call"], "generation_log_probs_delta": [0.0, rounded]}
    assert hash_staged_call(**base) == hash_staged_call(**same)
