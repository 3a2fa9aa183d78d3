"""The compact token form expanded into the standard record: lists, numpy views, both decoders."""

from __future__ import annotations

import copy
import json
import math
import sys
from typing import Any

import httpx
import numpy as np
import pytest

from tests.client.answers import compact, plain_answer, prompts
from token_finalizer_client import Finalized, FinalizerClient, FinalizerError
from token_finalizer_client import _json as json_module
from token_finalizer_client._wire import read_finalized


def _answered(answer: dict[str, Any], *, as_numpy: bool = False) -> Finalized:
    """`answer` read the way the clients read a 200 from /finalize (JSON body, decoded)."""
    request = httpx.Request("POST", "http://finalizer.test/finalize")
    response = httpx.Response(200, content=json.dumps(answer).encode(), request=request)
    return read_finalized(response, as_numpy=as_numpy)


def test_compact_answer_expands_to_the_plain_record() -> None:
    """A compact answer reads back as exactly the record of the plain answer."""
    plain = plain_answer(calls=5)
    assert _answered(compact(plain)).record == plain["record"]


def test_to_answer_is_the_standard_answer() -> None:
    """to_answer() of a compact answer is the plain v2 answer, without context_token_ids."""
    plain = plain_answer(calls=4)
    assert _answered(compact(plain)).to_answer() == plain


def test_expanded_prompts_are_slices_of_the_context() -> None:
    """Each list prompt holds the context's own int objects (a slice, no per-token work)."""
    answer = compact(plain_answer(calls=3))
    context = answer["context_token_ids"]
    for prompt in prompts(Finalized.from_answer(answer).record):
        assert all(token is context[i] for i, token in enumerate(prompt))


def test_prompts_already_lists_stay_lists() -> None:
    """Items whose prompt_token_ids is a list (a record with its own tokens) are kept as sent."""
    plain = plain_answer(calls=3)
    answer = compact(plain, keep=frozenset({0}))
    kept = answer["record"]["response"]["output"][0]["prompt_token_ids"]
    record = Finalized.from_answer(answer).record
    assert record["response"]["output"][0]["prompt_token_ids"] is kept
    assert record == plain["record"]


def test_without_context_nothing_is_expanded() -> None:
    """A null context_token_ids leaves the record exactly as sent (the same object)."""
    answer = {**plain_answer(calls=2), "context_token_ids": None}
    assert Finalized.from_answer(answer).record is answer["record"]


def test_reading_leaves_the_answer_unchanged() -> None:
    """from_answer copies what it expands: the answer object passed in is not modified."""
    answer = compact(plain_answer(calls=3))
    before = copy.deepcopy(answer)
    Finalized.from_answer(answer)
    assert answer == before


def test_prefix_length_without_context_is_refused() -> None:
    """An int prompt_token_ids with no context_token_ids raises FinalizerError."""
    answer = compact(plain_answer(calls=2))
    del answer["context_token_ids"]
    with pytest.raises(FinalizerError, match="no `context_token_ids`"):
        Finalized.from_answer(answer)


@pytest.mark.parametrize("length", [-1, 10_000])
def test_prefix_length_outside_the_context_is_refused(length: int) -> None:
    """A prefix length below zero or past the context's end raises FinalizerError."""
    answer = compact(plain_answer(calls=2))
    answer["record"]["response"]["output"][0]["prompt_token_ids"] = length
    with pytest.raises(FinalizerError, match="outside its"):
        Finalized.from_answer(answer)


def test_context_that_is_not_a_list_is_refused() -> None:
    """A context_token_ids that is neither a list nor null raises FinalizerError."""
    answer = {**compact(plain_answer(calls=2)), "context_token_ids": "1,2,3"}
    with pytest.raises(FinalizerError, match="context_token_ids"):
        Finalized.from_answer(answer)


def test_numpy_prompts_are_views_of_one_array() -> None:
    """With as_numpy every prompt is a view of the same int64 base array."""
    record = _answered(compact(plain_answer(calls=5)), as_numpy=True).record
    bases = {id(prompt.base) for prompt in prompts(record)}
    assert len(bases) == 1
    assert all(prompt.base is not None and prompt.dtype == np.int64 for prompt in prompts(record))


def test_numpy_prompts_equal_the_lists() -> None:
    """The numpy views hold exactly the tokens of the plain answer's prompts."""
    plain = plain_answer(calls=5)
    record = _answered(compact(plain), as_numpy=True).record
    assert [prompt.tolist() for prompt in prompts(record)] == prompts(plain["record"])


def test_numpy_shared_prompts_are_read_only() -> None:
    """Writing into one prompt view fails instead of changing every other prompt."""
    record = _answered(compact(plain_answer(calls=2)), as_numpy=True).record
    with pytest.raises(ValueError, match="read-only"):
        prompts(record)[-1][0] = 0


def test_numpy_generations_are_arrays() -> None:
    """With as_numpy generation_token_ids (int64) and generation_log_probs (float64) are arrays."""
    plain = plain_answer(calls=3)
    record = _answered(compact(plain), as_numpy=True).record
    item, expected = record["response"]["output"][0], plain["record"]["response"]["output"][0]
    assert (item["generation_token_ids"].dtype, item["generation_log_probs"].dtype) == (
        np.int64,
        np.float64,
    )
    assert item["generation_token_ids"].tolist() == expected["generation_token_ids"]
    assert item["generation_log_probs"].tolist() == expected["generation_log_probs"]


def test_numpy_list_prompts_become_arrays_too() -> None:
    """With as_numpy a prompt sent as a list is an array as well, so every prompt has one type."""
    plain = plain_answer(calls=3)
    record = _answered(compact(plain, keep=frozenset({0})), as_numpy=True).record
    assert all(isinstance(prompt, np.ndarray) for prompt in prompts(record))
    assert [prompt.tolist() for prompt in prompts(record)] == prompts(plain["record"])


def test_numpy_to_answer_is_plain_lists() -> None:
    """to_answer() of a numpy Finalized is the plain answer, every token array a list again."""
    plain = plain_answer(calls=4)
    answer = _answered(compact(plain), as_numpy=True).to_answer()
    assert answer == plain
    assert all(type(prompt) is list for prompt in prompts(answer["record"]))


def test_as_numpy_without_numpy_is_a_clear_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """FinalizerClient(as_numpy=True) without numpy raises ImportError naming the extra."""
    monkeypatch.setitem(sys.modules, "numpy", None)
    with pytest.raises(ImportError, match=r"token-finalizer-client\[fast\]"):
        FinalizerClient("http://finalizer.test", as_numpy=True)


def test_orjson_and_stdlib_decode_identically(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same compact answer reads back identically with orjson and with the stdlib."""
    answer = compact(plain_answer(calls=4))
    assert json_module._orjson is not None, "orjson is a test dependency (via the service)"
    with_orjson = _answered(answer)
    monkeypatch.setattr(json_module, "_orjson", None)
    assert _answered(answer) == with_orjson


def test_non_finite_numbers_fall_back_to_the_stdlib() -> None:
    """A body with -Infinity and NaN (refused by orjson) still decodes, as the stdlib reads it."""
    decoded = json_module.loads(b'{"lp": [-Infinity, NaN, -0.5]}')
    assert decoded["lp"][0] == -math.inf and math.isnan(decoded["lp"][1])


def test_stdlib_alone_decodes_non_finite_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without orjson the stdlib decodes the body, non-finite log probs included."""
    monkeypatch.setattr(json_module, "_orjson", None)
    assert json_module.loads(b"[-Infinity, 1]") == [-math.inf, 1]
