"""Spliced answer encoding: pieces always join to exactly the plain orjson bytes."""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from tests.support.captures import agent_rollout, record_for
from token_finalizer import MemoryTokenStore, finalize_record
from token_finalizer.api.encoding import SPLICE_MARK, finalize_answer_pieces, output_pieces
from token_finalizer.api.responses import encode_answer
from token_finalizer.core.codec import encode_json


def _answer(*, record_has_response: bool = True) -> dict[str, Any]:
    """A real v2 finalize answer: the rebuilt output lives in the record only."""
    store = MemoryTokenStore()
    record = record_for("r")
    if not record_has_response:
        del record["response"]

    async def finalize() -> dict[str, Any] | None:
        for entry in agent_rollout("r", calls=6, new_tokens_per_turn=50):
            await store.put(entry)
        build = await finalize_record(record, store)
        return None if build is None else build.to_dict(with_response=False)

    build = anyio.run(finalize)
    return {
        "rollout_id": "r",
        "source": "local",
        "record": record,
        "build": build,
        "retirable": True,
        "retire": None,
    }


def _item(prompt: np.ndarray, **extra: Any) -> dict[str, Any]:
    return {"type": "message", "prompt_token_ids": prompt, **extra}


@pytest.mark.parametrize("record_has_response", [True, False])
def test_answer_pieces_join_to_the_plain_encoding(record_has_response: bool) -> None:
    """A real answer's pieces concatenate to exactly `encode_json(answer)`."""
    payload = _answer(record_has_response=record_has_response)
    pieces = finalize_answer_pieces(payload)
    assert pieces is not None
    assert b"".join(pieces) == encode_json(payload)


def test_prompts_are_cut_from_one_text() -> None:
    """Nested prompts are slices of one encoded prompt (no token is encoded twice)."""
    output = _answer()["record"]["response"]["output"]
    pieces = output_pieces(output)
    assert pieces is not None
    views = [piece for piece in pieces if isinstance(piece, memoryview)]
    assert len({id(view.obj) for view in views}) == 1


@given(
    base=st.lists(st.integers(0, 2**31 - 1), max_size=60),
    cuts=st.lists(st.integers(0, 60), min_size=2, max_size=8),
    dtype=st.sampled_from([np.int32, np.int64]),
)
def test_nested_prompts_join_to_the_plain_encoding(
    base: list[int], cuts: list[int], dtype: type
) -> None:
    """Any prompts that are prefixes of one sequence, in any order and length, join exactly."""
    full = np.array(base, dtype=dtype)
    output = [_item(full[: min(cut, len(full))].copy(), n=i) for i, cut in enumerate(cuts)]
    pieces = output_pieces(output)
    assert pieces is not None
    assert b"".join(pieces) == encode_json(output)


def test_prompts_that_do_not_nest_are_not_cut() -> None:
    """A prompt that is not a prefix of the longest one disables cutting."""
    output = [_item(np.array([1, 2, 3])), _item(np.array([1, 9]))]
    assert output_pieces(output) is None


def test_diverging_output_still_encodes_exactly() -> None:
    """An answer whose prompts do not nest is not cut, and still gets its exact bytes."""
    payload = _answer()
    payload["record"]["response"]["output"][0]["prompt_token_ids"] = np.array([7, 7, 7])
    assert finalize_answer_pieces(payload) is None
    assert encode_answer(payload, None).body == encode_json(payload)


def test_non_integer_prompts_are_not_cut() -> None:
    """Prompt arrays that are not 1-D integer arrays disable cutting."""
    output = [_item(np.array([1.0, 2.0])), _item(np.array([1.0]))]
    assert output_pieces(output) is None


def test_single_prompt_is_not_cut() -> None:
    """With one prompt there is nothing to share."""
    assert output_pieces([_item(np.arange(5))]) is None


def test_compact_output_has_no_pieces() -> None:
    """A compact answer (prompts already prefix lengths) has nothing to cut: no pieces."""
    payload = _answer()
    output = payload["record"]["response"]["output"]
    payload["record"]["response"]["output"] = [
        {**item, "prompt_token_ids": len(item["prompt_token_ids"])} for item in output
    ]
    assert finalize_answer_pieces(payload) is None


def test_answer_without_build_has_no_pieces() -> None:
    """A null build (agent not taking part: the record as posted, no token arrays) has no pieces."""
    assert finalize_answer_pieces({**_answer(), "record": record_for("r"), "build": None}) is None


def test_answer_holds_the_output_once() -> None:
    """A v2 answer's pieces spell the rebuilt output once: the build has no rebuilt_response."""
    payload = _answer()
    pieces = finalize_answer_pieces(payload)
    assert pieces is not None
    assert "rebuilt_response" not in payload["build"]
    assert b"".join(pieces).count(b'"generation_token_ids"') == 6


def test_record_quoting_the_mark_is_encoded_plainly() -> None:
    """A record that contains the internal mark string still gets its exact bytes."""
    payload = _answer()
    payload["record"]["note"] = SPLICE_MARK
    assert finalize_answer_pieces(payload) is None
    assert encode_answer(payload, None).body == encode_json(payload)


def test_output_quoting_the_mark_is_not_cut() -> None:
    """An output item containing the mark string disables cutting."""
    output = [_item(np.arange(3), note=SPLICE_MARK), _item(np.arange(2))]
    assert output_pieces(output) is None


def test_identity_answer_is_the_plain_encoding() -> None:
    """Without zstd the spliced answer is the plain orjson bytes."""
    payload = _answer()
    response = encode_answer(payload, None)
    assert (response.body, response.headers.get("content-encoding")) == (encode_json(payload), None)


def test_zstd_answer_is_one_frame_with_its_size() -> None:
    """With zstd the body is one frame, decodable in one shot, of the plain bytes."""
    payload = _answer()
    response = encode_answer(payload, "zstd")
    assert response.headers["content-encoding"] == "zstd"
    assert zstandard.ZstdDecompressor().decompress(response.body) == encode_json(payload)
