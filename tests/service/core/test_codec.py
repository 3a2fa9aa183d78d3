"""Reading freeze answers: zstd decoding and the numpy shortcut for token arrays."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import orjson
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from tests.support.captures import agent_rollout, make_entry
from token_finalizer.core.codec import (
    CodecError,
    PromptReuse,
    has_long_digit_run,
    ids_from_text,
    loads_with_token_arrays,
    zstd_decompress,
)


def _answer(entries: list[dict]) -> dict:
    return {
        "rollout_id": "r",
        "entries": entries,
        "incomplete": False,
        "snapshot_id": "s",
        "version": 1,
    }


def _as_lists(data: dict) -> dict:
    """The parsed answer with every numpy array turned back into a list."""
    return orjson.loads(orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY))


def test_token_arrays_come_back_as_numpy() -> None:
    """Prompt and generation ids of every entry are numpy arrays after parsing."""
    data = loads_with_token_arrays(
        orjson.dumps(_answer(agent_rollout("r", calls=3, new_tokens_per_turn=8)))
    )
    assert all(
        isinstance(entry[key], np.ndarray)
        for entry in data["entries"]
        for key in ("prompt_token_ids", "generation_token_ids")
    )


def test_shortcut_parses_the_same_values_as_plain_json() -> None:
    """The parsed answer equals an ordinary JSON parse, value for value."""
    answer = _answer(agent_rollout("r", calls=4, new_tokens_per_turn=16))
    assert _as_lists(loads_with_token_arrays(orjson.dumps(answer))) == answer


def test_sorted_key_lines_parse_the_same() -> None:
    """Entries with generation ids before prompt ids (sorted keys) parse correctly."""
    answer = _answer(agent_rollout("r", calls=3, new_tokens_per_turn=8))
    body = orjson.dumps(answer, option=orjson.OPT_SORT_KEYS)
    assert _as_lists(loads_with_token_arrays(body)) == answer


def test_spaced_json_falls_back_to_the_plain_parse() -> None:
    """Pretty-printed arrays (spaces) are left to the ordinary parser and still read right."""
    answer = _answer([make_entry("r", "c1", [1, 2], [3])])
    data = loads_with_token_arrays(json.dumps(answer, indent=1).encode())
    assert _as_lists(data) == answer


def test_token_key_inside_an_output_item_falls_back_safely() -> None:
    """A token key nested in an output item does not displace the entry's own arrays."""
    entry = make_entry("r", "c1", [1, 2], [3], output_items=[{"prompt_token_ids": [7, 7]}])
    answer = _answer([entry])
    assert _as_lists(loads_with_token_arrays(orjson.dumps(answer))) == answer


def test_placeholder_lookalike_strings_are_not_replaced() -> None:
    """A string value that looks like a placeholder survives as the same string."""
    entry = make_entry("r", "c1", [1], [2], note="\u0000lifted:0\u0000")
    answer = _answer([entry])
    assert _as_lists(loads_with_token_arrays(orjson.dumps(answer))) == answer


def test_infinite_log_probs_survive() -> None:
    """`-Infinity` written by the stdlib parses back to -inf."""
    answer = _answer([make_entry("r", "c1", [1], [2, 3], log_probs=[-math.inf, -0.5])])
    data = loads_with_token_arrays(json.dumps(answer).encode())
    assert data["entries"][0]["generation_log_probs"] == [-math.inf, -0.5]


def test_unzstd_decodes_one_frame() -> None:
    """A single frame with its size decodes to the original bytes."""
    body = b'{"a": 1}' * 1000
    assert zstd_decompress(zstandard.ZstdCompressor().compress(body), limit=1 << 20) == body


def test_unzstd_decodes_several_frames_and_streamed_ones() -> None:
    """Concatenated frames, one without a content size, decode to the whole body."""
    first = zstandard.ZstdCompressor().compress(b"first,")
    streamed = zstandard.ZstdCompressor().compressobj()
    second = streamed.compress(b"second") + streamed.flush()
    assert zstd_decompress(first + second, limit=1 << 20) == b"first,second"


def test_unzstd_refuses_a_body_over_the_limit() -> None:
    """A body that would decode past the limit raises CodecError instead."""
    bomb = zstandard.ZstdCompressor().compress(b"\0" * 100_000)
    with pytest.raises(CodecError, match="limit"):
        zstd_decompress(bomb, limit=1000)


def test_unzstd_refuses_a_truncated_body() -> None:
    """A frame cut short raises CodecError."""
    streamed = zstandard.ZstdCompressor().compressobj()
    body = streamed.compress(bytes(range(256)) * 400) + streamed.flush()
    with pytest.raises(CodecError):
        zstd_decompress(body[: len(body) // 2], limit=1 << 20)


def test_ids_from_text_keeps_ids_up_to_two_to_the_64_exact() -> None:
    """Ids near 2**64 parse on the fast path as uint64, each one exact."""
    ids = ids_from_text(b"1,9223372036854775813,18446744073709551614")
    assert ids is not None and ids.dtype == np.uint64
    assert ids.tolist() == [1, 2**63 + 5, 2**64 - 2]


def test_ids_from_text_keeps_small_ids_int32() -> None:
    """Ids below 2**31 parse as int32 (half the memory)."""
    ids = ids_from_text(b"0,5,2147483647")
    assert ids is not None and ids.dtype == np.int32


@pytest.mark.parametrize("text", [b"1,18446744073709551616", b"18446744073709551615"])
def test_ids_from_text_leaves_a_maybe_saturated_id_to_the_exact_parse(text: bytes) -> None:
    """numpy saturates 2**64 to 2**64 - 1: any text reading as that value goes the slow way."""
    assert ids_from_text(text) is None


def test_id_of_two_to_the_64_reaches_validation_as_an_int() -> None:
    """An entry line holding 2**64 parses to that exact int, never a float orjson would make."""
    line = json.dumps(make_entry("r", "c1", [1, 2**64], [3])).replace(" ", "").encode()
    parsed = loads_with_token_arrays(line)
    assert parsed["prompt_token_ids"] == [1, 2**64]
    assert type(parsed["prompt_token_ids"][1]) is int


def test_prompt_reuse_widens_to_uint64_and_keeps_earlier_views() -> None:
    """A tail with a wide id moves the shared buffer to uint64; views handed out stay exact."""
    prompts = PromptReuse()
    first = prompts.parse(b"1,2")
    second = prompts.parse(b"1,2,18446744073709551614")
    third = prompts.parse(b"1,2,18446744073709551614,7")
    assert first is not None and second is not None and third is not None
    assert first.tolist() == [1, 2] and first.dtype == np.int32
    assert second.dtype == third.dtype == np.uint64
    assert third.tolist() == [1, 2, 2**64 - 2, 7]


# -- wide integers: which bodies need the exact (slow) parse ------------------------------------

_INTEGER_RUN_19 = re.compile(rb"(?<![.\dA-Za-z])\d{19}")


def test_a_long_fraction_is_not_a_wide_integer() -> None:
    """Digits after a decimal point (a float near zero) do not send a body to the slow parse."""
    assert not has_long_digit_run(b'{"generation_log_probs": [-0.000123456789012345678]}')


def test_a_nineteen_digit_integer_is_wide() -> None:
    """An integer of 19 digits may not fit orjson's integers: the exact parse is needed."""
    assert has_long_digit_run(b'{"reward": 1234567890123456789, "p": 0.5}')


def test_digits_inside_a_digest_are_not_a_wide_integer() -> None:
    """A hex digest with 19 decimal digits in a row is a string, not an integer."""
    assert not has_long_digit_run(b'{"digest": "ab1234567890123456789012cd"}')


@given(st.text(alphabet="0123456789.,-eEf ", max_size=80))
def test_wide_integer_detection_agrees_with_a_regex(text: str) -> None:
    """A body needs the exact parse iff it holds 19 digits in a row not after a '.' or a
    letter."""
    data = text.encode()
    assert has_long_digit_run(data) == bool(_INTEGER_RUN_19.search(data))
