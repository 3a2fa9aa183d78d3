"""TokenEntry validation and parsing (docs/records-and-builds.md#tokenentry)."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest

from tests.support.captures import make_entry
from token_finalizer import TokenEntry, TokenEntryError
from token_finalizer.core.codec import dumps_entry_line


def _entry(**overrides: object) -> dict:
    return {**make_entry("r", "c1", [1, 2, 3], [4, 5]), **overrides}


def test_valid_entry_parses_token_arrays() -> None:
    """Token ids and log probs become arrays holding exactly the given values."""
    entry = TokenEntry.from_dict(_entry())
    assert entry.prompt_token_ids.tolist() == [1, 2, 3]
    assert entry.generation_token_ids.tolist() == [4, 5]
    assert entry.generation_log_probs.tolist() == [-0.5, -0.501]


def test_log_prob_count_must_match_generation() -> None:
    """One log prob per generated token, else the entry is invalid."""
    with pytest.raises(TokenEntryError, match="generation_log_probs has 1 values for 2"):
        TokenEntry.from_dict(_entry(generation_log_probs=[-0.1]))


def test_newer_schema_version_is_refused() -> None:
    """A schema newer than the reader understands is refused, naming both versions."""
    with pytest.raises(TokenEntryError, match="schema_version 2 is newer than 1"):
        TokenEntry.from_dict(_entry(schema_version=2))


@pytest.mark.parametrize("version", [0, -1])
def test_schema_version_below_one_is_refused_in_nemo_gym_words(version: int) -> None:
    """Below the minimum 1 the entry is invalid, with NeMo Gym 0.7's own message."""
    with pytest.raises(TokenEntryError) as refused:
        TokenEntry.from_dict(_entry(schema_version=version))
    assert str(refused.value) == (
        f"token record is schema_version {version}, below the supported minimum 1. "
        "Pre-lineage records were never written in production; regenerate the rollout "
        "with a current writer."
    )


def test_schema_version_one_is_accepted() -> None:
    """Version 1, the only one written, is read."""
    assert TokenEntry.from_dict(_entry(schema_version=1)).schema_version == 1


def test_token_item_index_must_point_inside_output_items() -> None:
    """token_item_index outside output_items is invalid."""
    with pytest.raises(TokenEntryError, match="token_item_index 3"):
        TokenEntry.from_dict(_entry(token_item_index=3))


@pytest.mark.parametrize("bad", [[1.5, 2], ["1"], [None], [[1]], "12", [-1], [True, 2]])
def test_token_ids_must_be_non_negative_integers(bad: object) -> None:
    """Floats, strings, nulls, booleans, nesting and negatives are refused, never coerced."""
    with pytest.raises(TokenEntryError, match="prompt_token_ids"):
        TokenEntry.from_dict(_entry(prompt_token_ids=bad))


def test_unknown_fields_are_kept() -> None:
    """Unknown extra fields survive a round trip through to_dict."""
    entry = TokenEntry.from_dict(_entry(sampler={"temperature": 1.0}))
    assert entry.to_dict()["sampler"] == {"temperature": 1.0}


def test_routed_experts_are_carried_untouched() -> None:
    """routed_experts is kept exactly as given."""
    experts = [[[0, 3]], [[1, 2]]]
    assert TokenEntry.from_dict(_entry(routed_experts=experts)).routed_experts == experts


def test_invalid_ids_are_refused() -> None:
    """rollout_id must be a safe store key, model_call_id free of control characters."""
    with pytest.raises(TokenEntryError, match="rollout_id"):
        TokenEntry.from_dict(_entry(rollout_id="../x"))
    with pytest.raises(TokenEntryError, match="model_call_id"):
        TokenEntry.from_dict(_entry(model_call_id="a\x00b"))


def test_from_json_matches_from_dict() -> None:
    """The numpy fast path of from_json yields the same entry as parsing with orjson."""
    payload = _entry(prompt_token_ids=list(range(0, 3000, 7)), extra_field=[1, 2])
    line = dumps_entry_line(payload)
    fast, slow = TokenEntry.from_json(line), TokenEntry.from_dict(orjson.loads(line))
    assert fast.prompt_token_ids.tolist() == slow.prompt_token_ids.tolist()
    assert fast.generation_token_ids.tolist() == slow.generation_token_ids.tolist()
    assert fast.to_dict() == slow.to_dict()


def test_from_json_with_nested_token_key_falls_back_correctly() -> None:
    """A token key nested inside output_items does not confuse the fast path."""
    items = [{"type": "message", "prompt_token_ids": [9, 9]}]
    line = dumps_entry_line(_entry(output_items=items, token_item_index=0))
    entry = TokenEntry.from_json(line)
    assert entry.prompt_token_ids.tolist() == [1, 2, 3]
    assert entry.output_items == items


def test_from_json_reads_stdlib_infinity() -> None:
    """A line written by Python's json module with -Infinity log probs still parses."""
    line = json.dumps(_entry(generation_log_probs=[float("-inf"), -0.5]), sort_keys=True)
    assert TokenEntry.from_json(line).generation_log_probs[0] == -np.inf


def test_from_json_refuses_garbage_with_a_clear_error() -> None:
    """A line that is not JSON raises TokenEntryError saying so."""
    with pytest.raises(TokenEntryError, match="not valid JSON"):
        TokenEntry.from_json(b'{"rollout_id": ')


def test_entry_line_is_compact_with_sorted_keys() -> None:
    """The stored line is compact JSON with sorted keys, as NeMo Gym writes it."""
    line = dumps_entry_line({"b": 1, "a": [1, 2]})
    assert line == b'{"a":[1,2],"b":1}'


def test_entry_line_keeps_non_finite_log_probs() -> None:
    """Non-finite log probs are written as JSON tokens Python reads back, not as null."""
    line = dumps_entry_line({"generation_log_probs": [float("-inf")]})
    assert json.loads(line)["generation_log_probs"] == [float("-inf")]
