"""Projection of the main chain into Responses output items."""

from __future__ import annotations

from typing import Any

from tests.support.captures import assert_prefix_contiguous, make_entry, snapshot_of
from token_finalizer import rebuild_snapshot


def _response(*entries: dict[str, Any], model: str = "m") -> dict[str, Any]:
    build = rebuild_snapshot(snapshot_of(list(entries)), model=model).to_dict()
    assert build["rebuilt_response"] is not None, build.get("error")
    return build["rebuilt_response"]


def _tokens(item: dict[str, Any]) -> tuple[list[int], list[int]]:
    return list(item["prompt_token_ids"]), list(item["generation_token_ids"])


def test_item_at_token_item_index_gets_the_token_fields() -> None:
    """Only the item at token_item_index carries the tokens; the others are copied as they are."""
    items = [{"type": "reasoning", "summary": []}, {"type": "message", "content": "hi"}]
    output = _response(make_entry("r", "c1", [1, 2], [3], output_items=items, token_item_index=1))[
        "output"
    ]
    assert output[0] == {"type": "reasoning", "summary": []}
    assert _tokens(output[1]) == ([1, 2], [3])


def test_prompt_is_the_running_sequence_with_interstitials() -> None:
    """Each later prompt is the running sequence plus the interstitial (tool output)."""
    output = _response(
        make_entry("r", "c1", [1, 2], [3]),
        make_entry("r", "c2", [1, 2, 3, 40, 41], [5]),
    )["output"]
    assert _tokens(output[1]) == ([1, 2, 3, 40, 41], [5])
    assert_prefix_contiguous(output)


def test_null_index_puts_tokens_on_items_still_carrying_them() -> None:
    """With no index, the item that still carries generation_token_ids inline gets the fields."""
    items = [{"type": "function_call", "generation_token_ids": [3]}, {"type": "message"}]
    output = _response(make_entry("r", "c1", [1], [3], output_items=items, token_item_index=None))[
        "output"
    ]
    assert _tokens(output[0]) == ([1], [3])
    assert "prompt_token_ids" not in output[1]


def test_null_index_without_inline_tokens_uses_the_last_item() -> None:
    """With no index and no inline tokens, the last item gets the fields."""
    items = [{"type": "reasoning"}, {"type": "message"}]
    output = _response(make_entry("r", "c1", [1], [3], output_items=items, token_item_index=None))[
        "output"
    ]
    assert "prompt_token_ids" not in output[0]
    assert _tokens(output[1]) == ([1], [3])


def test_call_without_output_items_yields_a_message_item() -> None:
    """A call with no output items becomes one message item holding its tokens."""
    output = _response(make_entry("r", "c1", [1], [3], output_items=[], token_item_index=None))[
        "output"
    ]
    assert output[0]["type"] == "message" and _tokens(output[0]) == ([1], [3])


def test_routed_experts_are_attached_when_present() -> None:
    """routed_experts travels with the token fields, untouched."""
    entry = make_entry("r", "c1", [1], [3], routed_experts=[[4, 7]])
    assert _response(entry)["output"][0]["routed_experts"] == [[4, 7]]


def test_response_envelope_and_usage() -> None:
    """id, model, object and usage follow the contract."""
    response = _response(
        make_entry("r", "c1", [1, 2], [3, 4]),
        make_entry("r", "c2", [1, 2, 3, 4, 9], [5]),
        model="policy-7b",
    )
    assert response["id"] == "proj-r"
    assert response["model"] == "policy-7b"
    assert response["object"] == "response"
    assert response["usage"] == {"input_tokens": 2, "output_tokens": 3}


def test_two_items_carrying_tokens_violate_contiguity_and_mask() -> None:
    """Two inline token items in one call break contiguity: the build fails, masked."""
    items = [{"type": "a", "generation_token_ids": [3]}, {"type": "b", "generation_token_ids": [3]}]
    build = rebuild_snapshot(
        snapshot_of([make_entry("r", "c1", [1], [3], output_items=items, token_item_index=None)]),
        model="m",
    ).to_dict()
    assert build["rebuilt_response"] is None and build["mask_sample"] is True
    assert build["error"].startswith("AssertionError: projection is not prefix-contiguous: ")


def test_log_probs_survive_exactly() -> None:
    """Log probabilities are delivered bit for bit."""
    log_probs = [-0.1, -2.220446049250313e-16, -123.456789012345]
    output = _response(make_entry("r", "c1", [1], [3, 4, 5], log_probs=log_probs))["output"]
    assert list(output[0]["generation_log_probs"]) == log_probs
