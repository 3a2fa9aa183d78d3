"""Token ids in the client's record: exact up to 2**64 - 1, never coerced from other values."""

from __future__ import annotations

import json
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.client.answers import compact, plain_answer, prompts
from token_finalizer_client import Finalized, FinalizerError, MalformedAnswerError
from token_finalizer_client._wire import read_finalized

WIDE = [1, 2**63, 2**63 + 5, 2**64 - 1]


def _answered(answer: dict[str, Any], *, as_numpy: bool) -> Finalized:
    """`answer` read the way the clients read a 200 from /finalize (JSON body, decoded)."""
    request = httpx.Request("POST", "http://finalizer.test/finalize")
    response = httpx.Response(200, content=json.dumps(answer).encode(), request=request)
    return read_finalized(response, as_numpy=as_numpy)


def _with_wide_ids(answer: dict[str, Any]) -> dict[str, Any]:
    """A plain answer whose first item's prompt and generation start with ids near 2**64."""
    first = answer["record"]["response"]["output"][0]
    bearing = [i for i in answer["record"]["response"]["output"] if "prompt_token_ids" in i]
    for item in bearing:  # every prompt starts with the first one: keep them prefixes
        item["prompt_token_ids"][: len(WIDE)] = WIDE
    first["generation_token_ids"][0] = 2**64 - 1
    for item in bearing[1:]:
        item["prompt_token_ids"][len(first["prompt_token_ids"])] = 2**64 - 1
    return answer


def test_numpy_record_with_wide_ids_is_uint64_and_exact() -> None:
    """Ids of 2**63 and more make every token array of the record uint64, each id exact."""
    plain = _with_wide_ids(plain_answer(calls=3))
    record = _answered(compact(plain), as_numpy=True).record
    bearing = [i for i in record["response"]["output"] if "generation_token_ids" in i]
    assert {i[k].dtype for i in bearing for k in ("prompt_token_ids", "generation_token_ids")} == {
        np.dtype(np.uint64)
    }
    assert [prompt.tolist() for prompt in prompts(record)] == prompts(plain["record"])
    assert bearing[0]["generation_token_ids"][0] == 2**64 - 1


def test_numpy_record_of_small_ids_stays_int64() -> None:
    """Without a wide id the record's token arrays are int64, as before."""
    record = _answered(compact(plain_answer(calls=2)), as_numpy=True).record
    assert {prompt.dtype for prompt in prompts(record)} == {np.dtype(np.int64)}


def test_lists_with_wide_ids_are_exact_ints() -> None:
    """The default list record carries ids near 2**64 as the exact Python ints."""
    plain = _with_wide_ids(plain_answer(calls=3))
    assert _answered(compact(plain), as_numpy=False).record == plain["record"]


STRANGERS = [
    pytest.param(1.7, id="float"),
    pytest.param(2.0, id="integral-float"),
    pytest.param("12", id="string"),
    pytest.param(True, id="boolean"),
    pytest.param(None, id="null"),
    pytest.param(-1, id="negative"),
    pytest.param(2**64, id="two-to-the-64"),
]


@pytest.mark.parametrize("stranger", STRANGERS)
def test_numpy_refuses_a_context_id_that_is_not_a_token_id(stranger: object) -> None:
    """A context id like 1.7, "12" or true raises MalformedAnswerError, never becomes 1, 12, 1."""
    answer = compact(plain_answer(calls=2))
    answer["context_token_ids"][1] = stranger
    with pytest.raises(MalformedAnswerError, match="context_token_ids"):
        _answered(answer, as_numpy=True)


@pytest.mark.parametrize("stranger", STRANGERS)
def test_numpy_refuses_a_generation_id_that_is_not_a_token_id(stranger: object) -> None:
    """The same holds for a generation's ids."""
    answer = compact(plain_answer(calls=2))
    answer["record"]["response"]["output"][0]["generation_token_ids"][0] = stranger
    with pytest.raises(MalformedAnswerError, match="generation_token_ids"):
        _answered(answer, as_numpy=True)


@pytest.mark.parametrize("stranger", STRANGERS)
def test_numpy_refuses_a_list_prompt_id_that_is_not_a_token_id(stranger: object) -> None:
    """The same holds for a prompt sent as a list (a record that carried its own tokens)."""
    answer = compact(plain_answer(calls=2), keep=frozenset({0}))
    answer["record"]["response"]["output"][0]["prompt_token_ids"][0] = stranger
    with pytest.raises(MalformedAnswerError, match="prompt_token_ids"):
        _answered(answer, as_numpy=True)


@pytest.mark.parametrize("stranger", ["-0.5", True, None])
def test_numpy_refuses_a_log_prob_that_is_not_a_number(stranger: object) -> None:
    """A log prob given as a string, boolean or null raises instead of being converted."""
    answer = compact(plain_answer(calls=2))
    answer["record"]["response"]["output"][0]["generation_log_probs"][0] = stranger
    with pytest.raises(MalformedAnswerError, match="generation_log_probs"):
        _answered(answer, as_numpy=True)


def test_malformed_answer_error_is_a_finalizer_error() -> None:
    """Callers catching FinalizerError also catch a malformed answer."""
    assert issubclass(MalformedAnswerError, FinalizerError)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), min_size=2, max_size=30), st.integers(1, 5))
def test_any_ids_expand_exactly_in_both_modes(context: list[int], calls: int) -> None:
    """For random ids in [0, 2**64) both expansions give back exactly the context's prefixes."""
    cuts = sorted({min(len(context) - 1, i * len(context) // calls) for i in range(calls)})
    answer = compact(plain_answer(calls=1))
    item = answer["record"]["response"]["output"][0]
    answer["context_token_ids"] = context
    answer["record"]["response"]["output"] = [
        {**item, "prompt_token_ids": cut, "generation_token_ids": context[cut : cut + 1]}
        for cut in cuts
    ]
    for as_numpy in (False, True):
        record = _answered(answer, as_numpy=as_numpy).record
        got = [list(map(int, prompt)) for prompt in prompts(record)]
        assert got == [context[:cut] for cut in cuts]
        if not as_numpy:
            assert all(type(t) is int for prompt in prompts(record) for t in prompt)
